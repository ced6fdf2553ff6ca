package postgres

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/chargeonce/chargeonce"
)

// keyInsertBatchSQL is keyInsertSQL for many attempts in one statement: the
// records and their charges of a batch are inserted by one INSERT each,
// ON CONFLICT (merchant_id, key) DO NOTHING, and the statement returns one
// row per input ($12: its ordinal), either the record it inserted or the
// record that already held the key.
//
// The rows are inserted in the batch's order, which is sorted by
// (merchant_id, key): two batches that both wait for the other's
// uncommitted keys would deadlock, and a common order rules that out.
//
// An inserted record is returned from what was sent plus what the database
// decided (lease_until, created_at; the lease measured by its clock), not
// with RETURNING * and a join. A record that held the key before is read
// with the statement's snapshot, as in keyInsertSQL: one committed while
// the statement waited on it is invisible, and its input gets no row (the
// attempt then reads again, with a fresh snapshot).
const keyInsertBatchSQL = `
WITH input AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[],
		$7::bigint[], $8::bigint[], $9::text[], $10::text[], $11::text[])
		WITH ORDINALITY AS t(merchant_id, key, fingerprint, token, lease_us, charge_id,
			order_id, amount_cents, currency, payment_token, description, n)
), k AS (
	INSERT INTO idempotency_keys
		(merchant_id, key, fingerprint, token, state, lease_until, charge_id)
	SELECT merchant_id, key, fingerprint, token, 'processing',
		now() + lease_us * interval '1 microsecond', charge_id
	FROM input ORDER BY n
	ON CONFLICT (merchant_id, key) DO NOTHING
	RETURNING charge_id, lease_until, created_at
), c AS (
	INSERT INTO charges
		(id, merchant_id, idempotency_key, order_id, amount_cents, currency, payment_token, description, status)
	SELECT i.charge_id, i.merchant_id, i.key, i.order_id, i.amount_cents, i.currency, i.payment_token, i.description, 'processing'
	FROM k JOIN input i ON i.charge_id = k.charge_id
	RETURNING id, created_at
)
SELECT i.n, true,
	i.merchant_id, i.key, i.fingerprint, i.token, 'processing',
	k.lease_until, k.lease_until <= now(),
	GREATEST(0, (EXTRACT(EPOCH FROM k.lease_until - now()) * 1000000)::bigint),
	0, NULL::integer, NULL::bytea, k.created_at, NULL::timestamptz, interval '0', false,
	i.charge_id, i.merchant_id, i.key, i.order_id, i.amount_cents,
	i.currency, i.payment_token, i.description, 'processing', NULL::text,
	c.created_at
FROM k JOIN c ON c.id = k.charge_id JOIN input i ON i.charge_id = k.charge_id
UNION ALL
SELECT i.n, false, ` + recordColumns + `
FROM input i
JOIN idempotency_keys k ON k.merchant_id = i.merchant_id AND k.key = i.key
JOIN charges c ON c.id = k.charge_id
WHERE NOT EXISTS (SELECT FROM k WHERE k.charge_id = i.charge_id)`

// keyCompleteBatchSQL is keyCompleteSQL for many attempts in one
// statement: each record is completed only if it is still processing under
// its attempt's token (the compare-and-set, per row), and the statement
// returns the (merchant_id, key) of the records it completed. A batch never
// holds two completions of one key. The outbox trigger (0003) fires per
// row, as it does for the single statement.
const keyCompleteBatchSQL = `
WITH input AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::integer[], $5::bytea[], $6::text[], $7::text[], $8::bigint[])
		AS t(merchant_id, key, token, response_status, response_body, charge_status, decline_code, ttl_us)
), k AS (
	UPDATE idempotency_keys i
	SET state = 'completed', response_status = input.response_status, response_body = input.response_body,
		updated_at = now(), expires_at = now() + input.ttl_us * interval '1 microsecond'
	FROM input
	WHERE i.merchant_id = input.merchant_id AND i.key = input.key AND i.token = input.token AND i.state = 'processing'
	RETURNING i.merchant_id, i.key, i.charge_id, input.charge_status, input.decline_code
), c AS (
	UPDATE charges
	SET status = k.charge_status, decline_code = NULLIF(k.decline_code, ''), updated_at = now()
	FROM k WHERE charges.id = k.charge_id
)
SELECT merchant_id, key FROM k`

// insertJob is one attempt's KeyInsert round in the insert batcher.
type insertJob struct {
	jobState
	p chargeonce.KeyInsertParams
	// The outcome: the record (inserted or found), whether it had expired,
	// or err (pgx.ErrNoRows: the key is held by a record the statement
	// could not see).
	rec      chargeonce.KeyRecord
	inserted bool
	expired  bool
	err      error
}

// completeJob is one attempt's KeyComplete in the completion batcher.
type completeJob struct {
	jobState
	p   chargeonce.KeyCompleteParams
	err error // nil, ESTALE, or the failure
}

func jobKey(merchantID, key string) string { return merchantID + "\x00" + key }

func newBatchers(s *Store) {
	s.inserts = &batcher{
		run: s.runInsertBatch,
		single: func(j job, retry bool) {
			ij := j.(*insertJob)
			ij.rec, ij.inserted, ij.expired, ij.err = s.insertOne(ij.ctx, ij.p)
		},
	}
	s.completes = &batcher{
		run: s.runCompleteBatch,
		single: func(j job, retry bool) {
			cj := j.(*completeJob)
			cj.err = s.completeOne(cj.ctx, cj.p, retry)
		},
		conflicts: func(j job) string {
			p := j.(*completeJob).p
			return jobKey(p.MerchantID, p.Key)
		},
	}
}

// micros is d in whole microseconds, PostgreSQL's interval resolution.
func micros(d time.Duration) int64 { return d.Microseconds() }

// runInsertBatch inserts a batch of attempts in one statement. Attempts on
// the same key in one batch behave as concurrent single statements: the
// first wins and the others get its record (as a read after the commit
// would show it), so only one row per key is sent.
func (s *Store) runInsertBatch(ctx context.Context, batch []job) error {
	jobs := make([]*insertJob, len(batch))
	for i, j := range batch {
		jobs[i] = j.(*insertJob)
	}
	// Sorted, stably, so that the earliest attempt on a key is first.
	slices.SortStableFunc(jobs, func(a, b *insertJob) int {
		return cmp.Or(cmp.Compare(a.p.Charge.MerchantID, b.p.Charge.MerchantID),
			cmp.Compare(a.p.Charge.IdempotencyKey, b.p.Charge.IdempotencyKey))
	})
	var (
		src                              = make([]int, len(jobs)) // job i's row in sent
		sent                             []*insertJob
		merchants, keys, fps, tokens     []string
		chargeIDs, currencies, payTokens []string
		descriptions                     []string
		leases, orders, amounts          []int64
	)
	for i, j := range jobs {
		if i > 0 && jobs[i-1].p.Charge.MerchantID == j.p.Charge.MerchantID &&
			jobs[i-1].p.Charge.IdempotencyKey == j.p.Charge.IdempotencyKey {
			src[i] = len(sent) - 1 // a duplicate: answered from the first below
			continue
		}
		ch := j.p.Charge
		src[i] = len(sent)
		sent = append(sent, j)
		merchants = append(merchants, ch.MerchantID)
		keys = append(keys, ch.IdempotencyKey)
		fps = append(fps, j.p.Fingerprint)
		tokens = append(tokens, j.p.Token)
		leases = append(leases, micros(j.p.Lease))
		chargeIDs = append(chargeIDs, ch.ID)
		orders = append(orders, ch.OrderID)
		amounts = append(amounts, ch.AmountCents)
		currencies = append(currencies, ch.Currency)
		payTokens = append(payTokens, ch.PaymentToken)
		descriptions = append(descriptions, ch.Description)
	}
	type outcome struct {
		rec               chargeonce.KeyRecord
		inserted, expired bool
		got               bool
	}
	out := make([]outcome, len(sent))
	rows, err := s.pool.Query(ctx, keyInsertBatchSQL, merchants, keys, fps, tokens, leases, chargeIDs,
		orders, amounts, currencies, payTokens, descriptions)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			n        int64
			inserted bool
		)
		rec, expired, err := scanRecord(rows, &n, &inserted)
		if err != nil {
			return err
		}
		if n < 1 || int(n) > len(sent) {
			return fmt.Errorf("insert batch returned ordinal %d of %d", n, len(sent))
		}
		out[n-1] = outcome{rec: rec, inserted: inserted, expired: expired, got: true}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	// Every job gets the outcome of the row sent for its key: the sender
	// its own, a duplicate the same record, never as inserted.
	for i, j := range jobs {
		o := out[src[i]]
		switch {
		case !o.got:
			j.err = pgx.ErrNoRows
		case sent[src[i]] == j:
			j.rec, j.inserted, j.expired = o.rec, o.inserted, o.expired
		default:
			j.rec, j.expired = o.rec, o.expired
		}
	}
	return nil
}

// runCompleteBatch completes a batch of attempts in one statement.
func (s *Store) runCompleteBatch(ctx context.Context, batch []job) error {
	jobs := make([]*completeJob, len(batch))
	for i, j := range batch {
		jobs[i] = j.(*completeJob)
	}
	slices.SortFunc(jobs, func(a, b *completeJob) int {
		return cmp.Or(cmp.Compare(a.p.MerchantID, b.p.MerchantID), cmp.Compare(a.p.Key, b.p.Key))
	})
	n := len(jobs)
	var (
		merchants, keys, tokens  = make([]string, n), make([]string, n), make([]string, n)
		statuses                 = make([]int32, n)
		bodies                   = make([][]byte, n)
		chargeStatuses, declines = make([]string, n), make([]string, n)
		ttls                     = make([]int64, n)
	)
	for i, j := range jobs {
		p := j.p
		merchants[i], keys[i], tokens[i] = p.MerchantID, p.Key, p.Token
		statuses[i], bodies[i] = int32(p.ResponseStatus), p.ResponseBody //nolint:gosec // G115: an HTTP status (100–599)
		chargeStatuses[i], declines[i], ttls[i] = string(p.ChargeStatus), p.DeclineCode, micros(p.TTL)
	}
	rows, err := s.pool.Query(ctx, keyCompleteBatchSQL, merchants, keys, tokens, statuses, bodies, chargeStatuses, declines, ttls)
	if err != nil {
		return err
	}
	defer rows.Close()
	done := make(map[string]bool, n)
	for rows.Next() {
		var m, k string
		if err := rows.Scan(&m, &k); err != nil {
			return err
		}
		done[jobKey(m, k)] = true
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for _, j := range jobs {
		if !done[jobKey(j.p.MerchantID, j.p.Key)] {
			j.err = staleErr(j.p.Key)
		}
	}
	return nil
}

func staleErr(key string) error {
	return chargeonce.Errorf(chargeonce.ESTALE, "idempotency key %q is no longer processing under this attempt's token", key)
}
