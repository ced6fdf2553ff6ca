package racedemo

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/idempotency"
)

// The naive strategies' statements. $N placeholders work in PostgreSQL and
// in modernc's SQLite alike.
const (
	sqlNaiveCheck    = `SELECT id, status FROM race_naive_charges WHERE merchant_id = $1 AND order_id = $2 LIMIT 1`
	sqlNaiveInsert   = `INSERT INTO race_naive_charges (id, merchant_id, order_id, amount_cents, status) VALUES ($1, $2, $3, $4, $5)`
	sqlNaiveComplete = `UPDATE race_naive_charges SET status = $1 WHERE id = $2`

	sqlLockedInsert = `INSERT INTO race_locked_charges (merchant_id, idempotency_key, id, order_id, amount_cents, status)
		VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (merchant_id, idempotency_key) DO NOTHING
		RETURNING id`
	sqlLockedGet      = `SELECT status, response_status FROM race_locked_charges WHERE merchant_id = $1 AND idempotency_key = $2`
	sqlLockedComplete = `UPDATE race_locked_charges SET status = $1, response_status = $2 WHERE merchant_id = $3 AND idempotency_key = $4`
)

// checkThenAct is the naive first answer: look for the order's charge, and
// if there is none, insert one in a separate statement and charge it. The
// table has no unique constraint, so nothing stops two attempts that both
// found nothing. Do not copy this.
func (in *instance) checkThenAct(ctx context.Context, merchant string, it *intent, a *Attempt) {
	arrived := false
	arrive := func() {
		if !arrived {
			arrived = true
			it.arrive()
		}
	}
	defer arrive()

	from := a.now()
	var id string
	var status chargeonce.Status
	err := in.db.QueryRowContext(ctx,
		sqlNaiveCheck, merchant, it.req.OrderID).Scan(&id, &status)
	a.Check = a.since(from)
	switch {
	case err == nil:
		// The naive design answers with the charge it found.
		a.answer("200 found " + string(status))
		return
	case !errors.Is(err, sql.ErrNoRows):
		a.fail(fmt.Errorf("checking for the order's charge: %w", err))
		return
	}
	arrive()

	// The window: anything that happens between the check and the insert
	// widens it. Barrier waits until every attempt has checked; Pause is
	// the article's sleep.
	if in.opts.Barrier || in.opts.Pause > 0 {
		from := a.now()
		if in.opts.Barrier {
			select {
			case <-it.checked:
			case <-ctx.Done():
				a.fail(ctx.Err())
				return
			}
		}
		if err := sleep(ctx, in.opts.Pause); err != nil {
			a.fail(err)
			return
		}
		a.Pause = a.since(from)
	}

	id = idempotency.NewChargeID()
	from = a.now()
	_, err = in.db.ExecContext(ctx, sqlNaiveInsert,
		id, merchant, it.req.OrderID, it.req.AmountCents, string(chargeonce.StatusProcessing))
	a.Insert = a.since(from)
	if err != nil {
		a.fail(fmt.Errorf("inserting the charge: %w", err))
		return
	}
	a.Inserted = true

	res, err := in.capture(ctx, merchant, id, &it.req)
	if err != nil {
		a.fail(fmt.Errorf("calling the acquirer: %w", err))
		return
	}
	from = a.now()
	_, err = in.db.ExecContext(ctx, sqlNaiveComplete, string(res.Status), id)
	a.Response = a.since(from)
	if err != nil {
		a.fail(fmt.Errorf("storing the charge's status: %w", err))
		return
	}
	a.answer(answerFor(res.Status))
}

// lockedTransaction is insert-first done wrong: the insert on the UNIQUE key
// decides who charges, but its transaction stays open across the acquirer
// call, so every retry's insert waits on the uncommitted row's lock until
// the acquirer has answered. On SQLite, BEGIN IMMEDIATE takes the database's
// only write lock, so every attempt of every intent waits. Do not copy this.
func (in *instance) lockedTransaction(ctx context.Context, merchant string, it *intent, a *Attempt) {
	from := a.now()
	a.Tx.From = from
	tx, err := in.db.BeginTx(ctx, nil)
	if err != nil {
		a.Insert = a.since(from)
		a.fail(fmt.Errorf("beginning the transaction: %w", err))
		return
	}
	defer func() {
		_ = tx.Rollback() // no-op after Commit
		if a.Tx.To == 0 {
			a.Tx.To = a.now()
		}
	}()

	id := idempotency.NewChargeID()
	var got string
	err = tx.QueryRowContext(ctx, sqlLockedInsert,
		merchant, it.key, id, it.req.OrderID, it.req.AmountCents, string(chargeonce.StatusProcessing)).Scan(&got)
	a.Insert = a.since(from)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		// Another attempt holds the key; by now it has committed (that
		// is what the insert waited for). Answer with what it stored.
		from = a.now()
		var status chargeonce.Status
		var respStatus sql.NullInt64
		err = tx.QueryRowContext(ctx, sqlLockedGet, merchant, it.key).Scan(&status, &respStatus)
		if err == nil {
			err = tx.Commit()
		}
		a.Response = a.since(from)
		a.Tx.To = a.Response.To
		switch {
		case err != nil:
			a.fail(fmt.Errorf("reading the stored answer: %w", err))
		case respStatus.Valid:
			a.answer(fmt.Sprintf("%d replayed", respStatus.Int64))
		default:
			a.answer("409 in progress")
		}
		return
	case err != nil:
		a.fail(fmt.Errorf("inserting the charge: %w", err))
		return
	}
	a.Inserted = true

	// The mistake: the transaction, and the lock on the new row, stay open
	// while the acquirer takes its time.
	res, err := in.capture(ctx, merchant, id, &it.req)
	if err != nil {
		a.fail(fmt.Errorf("calling the acquirer: %w", err))
		return
	}
	from = a.now()
	_, err = tx.ExecContext(ctx, sqlLockedComplete,
		string(res.Status), statusCode(res.Status), merchant, it.key)
	if err == nil {
		err = tx.Commit()
	}
	a.Response = a.since(from)
	a.Tx.To = a.Response.To
	if err != nil {
		a.fail(fmt.Errorf("storing the answer: %w", err))
		return
	}
	a.answer(answerFor(res.Status))
}

// insertFirst is chargeonce: its engine, unchanged, over the real store.
// The store and acquirer wrappers only take the times.
func (in *instance) insertFirst(ctx context.Context, merchant string, it *intent, a *Attempt) {
	req := it.req
	resp, err := in.engine.Charge(ctx, merchant, it.key, &req)
	switch {
	case err == nil && resp.Replayed:
		a.answer(fmt.Sprintf("%d replayed", resp.Status))
	case err == nil && resp.Status == 202:
		a.answer("202 processing")
	case err == nil:
		a.answer(fmt.Sprintf("%d %s", resp.Status, statusWord(resp.Status)))
	case chargeonce.ErrorCode(err) == chargeonce.EINPROGRESS:
		a.answer("409 in progress")
	default:
		a.fail(err)
	}
}

// capture calls the acquirer with the charge's id as reference.
func (in *instance) capture(ctx context.Context, merchant, ref string, req *chargeonce.ChargeRequest) (chargeonce.CaptureResult, error) {
	actx, cancel := context.WithTimeout(ctx, max(acquirerTimeout, 2*in.opts.Latency))
	defer cancel()
	return in.acq.Capture(actx, chargeonce.CaptureRequest{
		Reference:    ref,
		OrderID:      req.OrderID,
		Merchant:     merchant,
		AmountCents:  req.AmountCents,
		Currency:     req.Currency,
		PaymentToken: req.PaymentToken,
	})
}

func statusCode(s chargeonce.Status) int {
	if s == chargeonce.StatusCaptured {
		return 201
	}
	return 402
}

func statusWord(code int) string {
	switch code {
	case 201:
		return "captured"
	case 402:
		return "declined"
	}
	return ""
}

func answerFor(s chargeonce.Status) string {
	return fmt.Sprintf("%d %s", statusCode(s), s)
}

// sleep waits d unless ctx ends first.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
