package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/chargeonce/chargeonce"
)

var _ chargeonce.OperatorStore = (*Store)(nil)

// chargeColumnsC are chargeColumns for a query that names charges "c".
const chargeColumnsC = `
	c.id, c.merchant_id, c.idempotency_key, c.order_id, c.amount_cents,
	c.currency, c.payment_token, c.description, c.status, c.decline_code, c.created_at, c.metadata,
	c.capture_method, c.captured_cents`

// inspectedRecordColumnsK are the columns recordScan reads of an inspected
// object's record, LEFT JOINed as "k" (all NULL once it has been swept).
const inspectedRecordColumnsK = `k.state, k.recovery_attempts, k.lease_until,
	k.state = 'processing' AND k.lease_held AND k.lease_until > now()`

// recordScan reads inspectedRecordColumnsK: dest appends the destinations
// to into, fill sets what they say.
type recordScan struct {
	state      *string
	attempts   *int
	leaseUntil *time.Time
	inFlight   *bool
}

func (s *recordScan) dest(into []any) []any {
	return append(into, &s.state, &s.attempts, &s.leaseUntil, &s.inFlight)
}

func (s *recordScan) fill(r *chargeonce.RecordInspection) {
	if s.state != nil {
		r.HasRecord, r.State, r.Attempts, r.NextAttempt, r.InFlight = true, chargeonce.KeyState(*s.state), *s.attempts, *s.leaseUntil, *s.inFlight
	}
}

// historyColumnsH are the columns scanHistory reads, for a query that names
// charge_history "h".
const historyColumnsH = `h.id, h.charge_id, h.merchant_id, h.at, h.kind, h.actor, h.outcome, h.detail, h.reason, h.forced`

func scanHistory(row pgx.Row) (chargeonce.HistoryEntry, error) {
	var (
		e    chargeonce.HistoryEntry
		kind string
	)
	err := row.Scan(&e.ID, &e.ChargeID, &e.MerchantID, &e.At, &kind, &e.Actor, &e.Outcome, &e.Detail, &e.Reason, &e.Forced)
	e.Kind = chargeonce.HistoryKind(kind)
	return e, err
}

// ChargesListStuck pages through the processing records of every merchant
// and of every kind (a charge's; a refund's, a manual capture's or a
// cancel's with its charge), oldest first, with each one's newest history entry and whether a live lease
// holds it (computed in the statement, by the database's clock; such
// records are left out unless p.IncludeLeased). Processing records are few
// (the partial index on lease_until holds only them), so the scan is over
// them, never over settled charges.
func (s *Store) ChargesListStuck(ctx context.Context, p chargeonce.StuckListParams) (chargeonce.StuckPage, error) {
	if err := p.Check(); err != nil {
		return chargeonce.StuckPage{}, err
	}
	var (
		afterAt *time.Time
		afterID string
	)
	if p.After != "" {
		var at time.Time
		err := s.pool.QueryRow(ctx, `
SELECT created_at FROM charges WHERE id = $1
UNION ALL SELECT created_at FROM refunds WHERE id = $1
UNION ALL SELECT created_at FROM charge_operations WHERE id = $1`, p.After).Scan(&at)
		if errors.Is(err, pgx.ErrNoRows) {
			return chargeonce.StuckPage{}, chargeonce.FieldError("after", "after must be the id of a charge, a refund, a capture or a cancel; %q is not", p.After)
		}
		if err != nil {
			return chargeonce.StuckPage{}, fmt.Errorf("listing stuck charges: %w", translate(err))
		}
		afterAt, afterID = &at, p.After
	}
	rows, err := s.pool.Query(ctx, `
SELECT `+chargeColumnsC+`,
	now() - COALESCE(r.created_at, o.created_at, c.created_at), k.recovery_attempts, k.lease_until,
	k.lease_held AND k.lease_until > now(),
	r.id, r.amount_cents, r.currency, r.status, r.reason, r.created_at,
	o.id, o.kind, o.idempotency_key, o.amount_cents, o.currency, o.status, o.created_at,
	h.id, h.charge_id, h.merchant_id, h.at, h.kind, h.actor, h.outcome, h.detail, h.reason, h.forced
FROM idempotency_keys k`+anyRecordFrom+`
LEFT JOIN LATERAL (
	SELECT * FROM charge_history hh WHERE hh.charge_id = k.charge_id ORDER BY hh.id DESC LIMIT 1
) h ON true
WHERE k.state = 'processing'
	AND ($1 = '' OR k.merchant_id = $1)
	AND COALESCE(r.created_at, o.created_at, c.created_at) <= now() - $2::interval
	AND ($3::timestamptz IS NULL OR (COALESCE(r.created_at, o.created_at, c.created_at), k.charge_id) > ($3, $4))
	AND ($6 OR NOT (k.lease_held AND k.lease_until > now()))
ORDER BY COALESCE(r.created_at, o.created_at, c.created_at), k.charge_id
LIMIT $5`, p.MerchantID, p.OlderThan, afterAt, afterID, p.Limit+1, p.IncludeLeased)
	if err != nil {
		return chargeonce.StuckPage{}, fmt.Errorf("listing stuck charges: %w", translate(err))
	}
	defer rows.Close()
	var page chargeonce.StuckPage
	for rows.Next() {
		var (
			sc                              chargeonce.StuckCharge
			cs                              chargeScan
			rID, rCurrency, rStatus, rWhy   *string
			rAmount                         *int64
			rAt                             *time.Time
			op                              stuckOperationRow
			hID                             *int64
			hCharge, hMerchant, hKind       *string
			hActor, hOutcome, hDetail, hWhy *string
			hAt                             *time.Time
			hForced                         *bool
		)
		c := &sc.Charge
		if err := rows.Scan(append(cs.dest(make([]any, 0, chargeScanColumns+27), c),
			&sc.Age, &sc.Attempts, &sc.NextAttempt, &sc.InFlight,
			&rID, &rAmount, &rCurrency, &rStatus, &rWhy, &rAt,
			&op.id, &op.kind, &op.key, &op.amount, &op.currency, &op.status, &op.created,
			&hID, &hCharge, &hMerchant, &hAt, &hKind, &hActor, &hOutcome, &hDetail, &hWhy, &hForced,
		)...); err != nil {
			return chargeonce.StuckPage{}, fmt.Errorf("listing stuck charges: %w", translate(err))
		}
		if err := cs.finish(c); err != nil {
			return chargeonce.StuckPage{}, fmt.Errorf("listing stuck charges: %w", err)
		}
		if rID != nil {
			sc.Refund = &chargeonce.Refund{
				ID: *rID, MerchantID: c.MerchantID, ChargeID: c.ID, AmountCents: *rAmount, Currency: *rCurrency,
				Status: chargeonce.RefundStatus(*rStatus), Reason: *rWhy, CreatedAt: *rAt,
			}
		}
		sc.Operation = op.operation(c)
		if hID != nil {
			sc.Last = &chargeonce.HistoryEntry{
				ID: *hID, ChargeID: *hCharge, MerchantID: *hMerchant, At: *hAt,
				Kind: chargeonce.HistoryKind(*hKind), Actor: *hActor, Outcome: *hOutcome,
				Detail: *hDetail, Reason: *hWhy, Forced: *hForced,
			}
		}
		page.Charges = append(page.Charges, sc)
	}
	if err := rows.Err(); err != nil {
		return chargeonce.StuckPage{}, fmt.Errorf("listing stuck charges: %w", translate(err))
	}
	if len(page.Charges) > p.Limit {
		page.Charges, page.HasMore = page.Charges[:p.Limit], true
	}
	return page, nil
}

// stuckOperationRow is the scan target of a stuck list row's operation
// columns, NULL when the record guards no capture or cancel.
type stuckOperationRow struct {
	id, kind, key, currency, status *string
	amount                          *int64
	created                         *time.Time
}

// operation is the row's capture or cancel of ch, or nil.
func (r *stuckOperationRow) operation(ch *chargeonce.Charge) *chargeonce.Operation {
	if r.id == nil {
		return nil
	}
	return &chargeonce.Operation{
		ID: *r.id, Kind: chargeonce.RecordKind(*r.kind), MerchantID: ch.MerchantID, IdempotencyKey: *r.key,
		ChargeID: ch.ID, AmountCents: *r.amount, Currency: *r.currency,
		Status: chargeonce.OperationStatus(*r.status), CreatedAt: *r.created,
	}
}

// OperationInspect reads any merchant's capture or cancel by id, with its
// charge and its record, if the record is still there.
func (s *Store) OperationInspect(ctx context.Context, id string) (chargeonce.OperationInspection, error) {
	if !chargeonce.ValidText(id) {
		return chargeonce.OperationInspection{}, chargeonce.Errorf(chargeonce.ENOTFOUND, "%s %q not found", objectName(id), id)
	}
	var (
		in chargeonce.OperationInspection
		op operationRow
		cs chargeScan
		rs recordScan
	)
	c := &in.Charge
	dest := rs.dest(cs.dest(append(op.dest(), &in.UpdatedAt), c))
	err := s.pool.QueryRow(ctx, `
SELECT `+operationColumns+`, o.updated_at, `+chargeColumnsC+`, `+inspectedRecordColumnsK+`
FROM charge_operations o
JOIN charges c ON c.id = o.charge_id
LEFT JOIN idempotency_keys k ON k.merchant_id = o.merchant_id AND k.key = o.idempotency_key AND k.charge_id = o.id
WHERE o.id = $1`, id).Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		return chargeonce.OperationInspection{}, chargeonce.Errorf(chargeonce.ENOTFOUND, "%s %q not found", objectName(id), id)
	}
	if err != nil {
		return chargeonce.OperationInspection{}, fmt.Errorf("inspecting %s: %w", objectName(id), translate(err))
	}
	if err := cs.finish(c); err != nil {
		return chargeonce.OperationInspection{}, fmt.Errorf("inspecting %s: %w", objectName(id), err)
	}
	in.Operation = *op.operation()
	in.Age = time.Duration(*op.age) * time.Microsecond
	rs.fill(&in.RecordInspection)
	return in, nil
}

// ChargeOperations lists the capture or cancel that holds a charge
// (pending or succeeded: at most one), by the partial unique index
// charge_operations_one_live; failed ones are not read (no index holds
// them by charge).
func (s *Store) ChargeOperations(ctx context.Context, chargeID string) ([]chargeonce.Operation, error) {
	if !chargeonce.ValidText(chargeID) {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, `
SELECT `+operationColumns+` FROM charge_operations o WHERE o.charge_id = $1 AND o.status <> 'failed'
ORDER BY o.created_at DESC, o.id DESC LIMIT $2`, chargeID, chargeonce.StuckListMaxLimit)
	if err != nil {
		return nil, fmt.Errorf("listing a charge's operations: %w", translate(err))
	}
	defer rows.Close()
	var out []chargeonce.Operation
	for rows.Next() {
		var op operationRow
		if err := rows.Scan(op.dest()...); err != nil {
			return nil, fmt.Errorf("listing a charge's operations: %w", translate(err))
		}
		out = append(out, *op.operation())
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing a charge's operations: %w", translate(err))
	}
	return out, nil
}

// ChargeInspect reads any merchant's charge by id with its record, if the
// record is still there.
func (s *Store) ChargeInspect(ctx context.Context, id string) (chargeonce.ChargeInspection, error) {
	if !chargeonce.ValidText(id) {
		return chargeonce.ChargeInspection{}, chargeonce.Errorf(chargeonce.ENOTFOUND, "charge %q not found", id)
	}
	var (
		in chargeonce.ChargeInspection
		cs chargeScan
		rs recordScan
	)
	c := &in.Charge
	err := s.pool.QueryRow(ctx, `
SELECT `+chargeColumnsC+`, c.updated_at, now() - c.created_at, `+inspectedRecordColumnsK+`
FROM charges c
LEFT JOIN idempotency_keys k ON k.merchant_id = c.merchant_id AND k.key = c.idempotency_key AND k.charge_id = c.id
WHERE c.id = $1`, id).Scan(rs.dest(append(cs.dest(make([]any, 0, chargeScanColumns+6), c), &in.UpdatedAt, &in.Age))...)
	if errors.Is(err, pgx.ErrNoRows) {
		return chargeonce.ChargeInspection{}, chargeonce.Errorf(chargeonce.ENOTFOUND, "charge %q not found", id)
	}
	if err != nil {
		return chargeonce.ChargeInspection{}, fmt.Errorf("inspecting charge: %w", translate(err))
	}
	if err := cs.finish(c); err != nil {
		return chargeonce.ChargeInspection{}, fmt.Errorf("inspecting charge: %w", err)
	}
	rs.fill(&in.RecordInspection)
	return in, nil
}

// ChargeHistory returns a charge's appended entries, oldest first.
func (s *Store) ChargeHistory(ctx context.Context, chargeID string) ([]chargeonce.HistoryEntry, error) {
	if !chargeonce.ValidText(chargeID) {
		return []chargeonce.HistoryEntry{}, nil
	}
	return s.historyQuery(ctx, "reading charge history", `
SELECT `+historyColumnsH+` FROM charge_history h WHERE h.charge_id = $1 ORDER BY h.id`, chargeID)
}

// AuditList returns resolutions, newest first.
func (s *Store) AuditList(ctx context.Context, p chargeonce.AuditListParams) ([]chargeonce.HistoryEntry, error) {
	if err := p.Check(); err != nil {
		return nil, err
	}
	return s.historyQuery(ctx, "reading the audit trail", `
SELECT `+historyColumnsH+` FROM charge_history h
WHERE h.kind IN ('resolution', 'resolve-refused') AND ($1 = 0 OR h.id < $1)
ORDER BY h.id DESC LIMIT $2`, p.Before, p.Limit)
}

func (s *Store) historyQuery(ctx context.Context, what, sql string, args ...any) ([]chargeonce.HistoryEntry, error) {
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, translate(err))
	}
	defer rows.Close()
	out := []chargeonce.HistoryEntry{}
	for rows.Next() {
		e, err := scanHistory(rows)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, translate(err))
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, translate(err))
	}
	return out, nil
}

// historyInsertSQL appends entries given as parallel arrays, in one
// statement; rows get ids in the arrays' order.
const historyInsertSQL = `
INSERT INTO charge_history (charge_id, merchant_id, kind, actor, outcome, detail, reason, forced)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::boolean[])`

func historyArgs(entries []chargeonce.HistoryEntry) ([]any, error) {
	cols := make([][]string, 7)
	forced := make([]bool, 0, len(entries))
	for i := range entries {
		e := &entries[i]
		if err := e.CheckText(); err != nil {
			return nil, err
		}
		for j, v := range []string{e.ChargeID, e.MerchantID, string(e.Kind), e.Actor, e.Outcome, e.Detail, e.Reason} {
			cols[j] = append(cols[j], v)
		}
		forced = append(forced, e.Forced)
	}
	return []any{cols[0], cols[1], cols[2], cols[3], cols[4], cols[5], cols[6], forced}, nil
}

// HistoryAppend appends entries in one statement.
func (s *Store) HistoryAppend(ctx context.Context, entries ...chargeonce.HistoryEntry) error {
	if len(entries) == 0 {
		return nil
	}
	args, err := historyArgs(entries)
	if err != nil {
		return err
	}
	if _, err := s.pool.Exec(ctx, historyInsertSQL, args...); err != nil {
		return fmt.Errorf("appending charge history: %w", translate(err))
	}
	return nil
}

// ChargeResolveClaim gives the processing record of a charge, of a refund
// (id re_…), or of a capture or cancel (cp_…, vd_…) to an operator's
// resolution when nobody drives it: its
// lease ended, or its owner let go and the rest is a back-off
// (lease_held). An attempt or recovery pass in flight keeps it (ELEASED):
// taking it over would let the resolution settle while that attempt's
// capture or refund may still land.
func (s *Store) ChargeResolveClaim(ctx context.Context, id, newToken string, lease time.Duration) (chargeonce.KeyRecord, error) {
	if !chargeonce.ValidText(id) {
		return chargeonce.KeyRecord{}, chargeonce.Errorf(chargeonce.ENOTFOUND, "%s %q not found", objectName(id), id)
	}
	// old locks the row first and reads the lease the claim takes over
	// as the row is now (a FOR UPDATE in READ COMMITTED follows a
	// concurrent update to its newest version), so that quiet measures
	// from the last lease written, never from a stale snapshot's.
	var quiet int64 // µs
	rec, _, err := scanAnyRecord(s.pool.QueryRow(ctx, `
WITH obj AS (`+objectKeysSQL+`
), old AS (
	SELECT k.merchant_id, k.key, k.lease_until
	FROM idempotency_keys k JOIN obj ON k.merchant_id = obj.merchant_id AND k.key = obj.idempotency_key
	WHERE k.charge_id = $1 AND k.state = $4
	FOR UPDATE OF k
), k AS (
	UPDATE idempotency_keys k
	SET token = $2, lease_until = now() + $3::interval, lease_held = true, updated_at = now()
	FROM old
	WHERE k.merchant_id = old.merchant_id AND k.key = old.key AND k.charge_id = $1
		AND k.state = $4 AND (k.lease_until <= now() OR NOT k.lease_held)
	RETURNING k.*, (EXTRACT(EPOCH FROM now() - old.lease_until) * 1000000)::bigint AS quiet_us
)
SELECT k.quiet_us, `+refundColumns+`, `+operationColumns+`, `+recordColumns+`
FROM k`+anyRecordFrom, id, newToken, lease, stateProcessing), &quiet)
	rec.Quiet = time.Duration(quiet) * time.Microsecond
	if errors.Is(err, pgx.ErrNoRows) {
		return chargeonce.KeyRecord{}, s.resolveClaimRefused(ctx, id)
	}
	if err != nil {
		return chargeonce.KeyRecord{}, fmt.Errorf("claiming %s for resolution: %w", objectName(id), translate(err))
	}
	return rec, nil
}

// objectKeysSQL finds the (merchant, key) of the object $1 names: a
// charge, a refund, or a capture or cancel.
const objectKeysSQL = `
	SELECT merchant_id, idempotency_key FROM charges WHERE id = $1
	UNION ALL SELECT merchant_id, idempotency_key FROM refunds WHERE id = $1
	UNION ALL SELECT merchant_id, idempotency_key FROM charge_operations WHERE id = $1`

// objectName names what an id is: a refund (re_…), a capture (cp_…), a
// cancel (vd_…) or a charge.
func objectName(id string) string {
	switch {
	case strings.HasPrefix(id, "re_"):
		return "refund"
	case strings.HasPrefix(id, "cp_"):
		return "capture"
	case strings.HasPrefix(id, "vd_"):
		return "cancel"
	}
	return "charge"
}

// resolveClaimRefused says why ChargeResolveClaim claimed nothing: no such
// charge or refund, one no longer processing, or a lease held and running.
func (s *Store) resolveClaimRefused(ctx context.Context, id string) error {
	var remaining int64 // µs
	err := s.pool.QueryRow(ctx, `
SELECT GREATEST(0, (EXTRACT(EPOCH FROM k.lease_until - now()) * 1000000)::bigint)
FROM idempotency_keys k
WHERE k.charge_id = $1 AND k.state = $2 AND (k.merchant_id, k.key) IN (`+objectKeysSQL+`)`, id, stateProcessing).Scan(&remaining)
	if err == nil {
		return chargeonce.LeasedError(id, time.Duration(remaining)*time.Microsecond)
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("claiming %s for resolution: %w", objectName(id), translate(err))
	}
	var exists bool
	if err := s.pool.QueryRow(ctx, `SELECT EXISTS (`+objectKeysSQL+`)`, id).Scan(&exists); err != nil {
		return fmt.Errorf("claiming %s for resolution: %w", objectName(id), translate(err))
	}
	if !exists {
		return chargeonce.Errorf(chargeonce.ENOTFOUND, "%s %q not found", objectName(id), id)
	}
	return chargeonce.Errorf(chargeonce.ENOTPROCESSING, "%s %s is no longer processing", objectName(id), id)
}

// ChargeResolve runs the very statement KeyComplete runs for an attempt
// alone (keyCompleteSQL: whatever it writes besides the record, such as the
// queue outbox's row, it writes for a resolution too) and appends the audit
// entry, in one transaction.
func (s *Store) ChargeResolve(ctx context.Context, p chargeonce.ResolveParams) (chargeonce.HistoryEntry, error) {
	args, err := historyArgs([]chargeonce.HistoryEntry{p.Audit})
	if err != nil {
		return chargeonce.HistoryEntry{}, err
	}
	c := p.Complete
	audit := p.Audit
	switch {
	case c.Kind == chargeonce.KindRefund && !c.RefundStatus.Final():
		return chargeonce.HistoryEntry{}, chargeonce.Errorf(chargeonce.EINVALID, "a refund is resolved succeeded, failed or canceled, not %q", c.RefundStatus)
	case (c.Kind == chargeonce.KindCapture || c.Kind == chargeonce.KindCancel) && !c.OperationStatus.Final():
		return chargeonce.HistoryEntry{}, chargeonce.Errorf(chargeonce.EINVALID, "a %s is resolved succeeded or failed, not %q", c.Kind, c.OperationStatus)
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var n int
		// The statement attempts and recovery settle with, for the
		// record's kind (a refund's gives a failed refund's amount back;
		// a succeeded capture's or cancel's settles its charge, which
		// records charge.captured or charge.canceled).
		sql, status, detail := keyCompleteSQL, string(c.ChargeStatus), c.DeclineCode
		switch c.Kind {
		case chargeonce.KindRefund:
			sql, status, detail = refundCompleteStatement(c.RefundStatus), string(c.RefundStatus), c.FailureReason
		case chargeonce.KindCapture, chargeonce.KindCancel:
			sql, status, detail = operationCompleteSQL, string(c.OperationStatus), c.FailureReason
		}
		if err := tx.QueryRow(ctx, sql,
			c.MerchantID, c.Key, c.Token, c.ResponseStatus, c.ResponseBody, status, detail, c.TTL, stateProcessing,
		).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return staleErr(c.Key)
		}
		return tx.QueryRow(ctx, historyInsertSQL+" RETURNING id, at", args...).Scan(&audit.ID, &audit.At)
	})
	if chargeonce.ErrorCode(err) == chargeonce.ESTALE {
		return chargeonce.HistoryEntry{}, err
	}
	if err != nil {
		return chargeonce.HistoryEntry{}, fmt.Errorf("resolving charge: %w", translate(err))
	}
	return audit, nil
}
