package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/chargeonce/chargeonce"
)

var _ chargeonce.ReconStore = (*Store)(nil)

// ChargesListByReference returns one page of the charges created in
// [p.From, p.To), in id order, after p.After.
//
// The query is a range scan of the primary key from the cursor (within
// [IDMin, IDMax) when given) that filters on created_at: no index is added
// to charges for reconciliation, so the charge path pays nothing for it.
// Without id bounds a run reads the primary key from the first id onwards
// once (one page after another), proportional to the table rather than the
// day; with them (package recon derives them from the period, as charge
// ids begin with their creation time) it reads the period's stretch. The merge-join needs byte order (Go's string order):
// charge ids are ASCII, which every collation we run on (C, C.UTF-8,
// en_US.UTF-8 for the "ch_" + hex ids the engine makes) orders that way,
// and package recon checks the order of every page and fails loudly if
// it is not.
func (s *Store) ChargesListByReference(ctx context.Context, p chargeonce.ReconChargesParams) ([]chargeonce.Charge, error) {
	if p.Limit <= 0 || p.Limit > chargeonce.ReconMaxPage {
		return nil, chargeonce.FieldError("limit", "limit must be 1 to %d; got %d", chargeonce.ReconMaxPage, p.Limit)
	}
	if !chargeonce.ValidText(p.After) {
		return nil, chargeonce.FieldError("after", "after must be valid UTF-8 without U+0000")
	}
	if !chargeonce.ValidText(p.IDMin) || !chargeonce.ValidText(p.IDMax) {
		return nil, chargeonce.FieldError("id_min", "id bounds must be valid UTF-8 without U+0000")
	}
	// An empty IDMax is no upper bound. The bound is its own statement
	// rather than ($6 = '' OR id < $6), so that a generic plan still stops
	// the primary key's range scan at IDMax.
	q, args := `SELECT `+chargeColumns+` FROM charges
WHERE id > $1 AND id >= $5 AND created_at >= $2 AND created_at < $3
ORDER BY id LIMIT $4`, []any{p.After, p.From, p.To, p.Limit, p.IDMin}
	if p.IDMax != "" {
		q, args = `SELECT `+chargeColumns+` FROM charges
WHERE id > $1 AND id >= $5 AND id < $6 AND created_at >= $2 AND created_at < $3
ORDER BY id LIMIT $4`, append(args, p.IDMax)
	}
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("listing charges by reference: %w", translate(err))
	}
	charges, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (chargeonce.Charge, error) { return scanCharge(row) })
	if err != nil {
		return nil, fmt.Errorf("listing charges by reference: %w", translate(err))
	}
	return charges, nil
}

// ReconRunSave inserts the run or, when (acquirer, period) has one,
// replaces its report and counts one more run, in one statement.
func (s *Store) ReconRunSave(ctx context.Context, run chargeonce.ReconRun) (chargeonce.ReconRun, error) {
	if !chargeonce.ValidText(run.Acquirer) || !chargeonce.ValidText(run.Period) || run.Acquirer == "" || run.Period == "" {
		return chargeonce.ReconRun{}, chargeonce.FieldError("period", "a run needs an acquirer and a period of valid text")
	}
	counts, err := json.Marshal(run.Counts)
	if err != nil {
		return chargeonce.ReconRun{}, fmt.Errorf("encoding run counts: %w", err)
	}
	report := run.Report
	if report == nil {
		report = []byte{}
	}
	var saved chargeonce.ReconRun
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		saved, err = scanReconRun(tx.QueryRow(ctx, `INSERT INTO recon_runs
	(acquirer, period, period_from, period_to, counts, report)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (acquirer, period) DO UPDATE SET
	period_from = excluded.period_from, period_to = excluded.period_to,
	counts = excluded.counts, report = excluded.report,
	runs = recon_runs.runs + 1, updated_at = now()
RETURNING `+reconRunColumns, run.Acquirer, run.Period, run.From, run.To, string(counts), report))
		if err != nil {
			return err
		}
		for _, m := range run.Merchants {
			if !chargeonce.ValidText(m.MerchantID) || m.MerchantID == "" {
				return chargeonce.FieldError("merchant_id", "a merchant's share needs a merchant id of valid text")
			}
			mc, err := json.Marshal(m.Counts)
			if err != nil {
				return fmt.Errorf("encoding run counts: %w", err)
			}
			id := chargeonce.ReconMerchantRunID(run.Acquirer, run.Period, m.MerchantID)
			// The event is written by the statement that first stores the
			// share: a re-run updates the share and finds the event there.
			if _, err := tx.Exec(ctx, `WITH share AS (
	INSERT INTO recon_run_merchants (acquirer, period, merchant_id, id, charges, refunds, matched, counts, operations)
	VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $10)
	ON CONFLICT (acquirer, period, merchant_id) DO UPDATE SET
		charges = excluded.charges, refunds = excluded.refunds, matched = excluded.matched,
		counts = excluded.counts, operations = excluded.operations, updated_at = now()
	RETURNING id
)
INSERT INTO webhook_events (id, merchant_id, charge_id, object_id, type)
SELECT 'evt_' || share.id, $3, share.id, share.id, $9 FROM share
ON CONFLICT DO NOTHING`, run.Acquirer, run.Period, m.MerchantID, id, m.Charges, m.Refunds, m.Matched, string(mc), chargeonce.EventReconciliationCompleted, m.Operations); err != nil {
				return fmt.Errorf("storing a merchant's share of the run: %w", translate(err))
			}
		}
		return nil
	})
	if err != nil {
		if ce := chargeonce.ErrorCode(err); ce != "" && ce != chargeonce.EINTERNAL {
			return chargeonce.ReconRun{}, err
		}
		return chargeonce.ReconRun{}, fmt.Errorf("storing reconciliation run: %w", translate(err))
	}
	saved.Merchants = run.Merchants
	return saved, nil
}

// ReconMerchantRunGet returns the merchant's share of a run by its id.
func (s *Store) ReconMerchantRunGet(ctx context.Context, merchantID, id string) (chargeonce.ReconMerchantRun, error) {
	notFound := chargeonce.Errorf(chargeonce.ENOTFOUND, "reconciliation run %q not found", id)
	if !chargeonce.ValidText(merchantID) || !chargeonce.ValidText(id) {
		return chargeonce.ReconMerchantRun{}, notFound
	}
	var (
		m      chargeonce.ReconMerchantRun
		counts string
	)
	err := s.pool.QueryRow(ctx, `SELECT m.id, m.acquirer, m.period, m.merchant_id, r.period_from, r.period_to,
	m.charges, m.refunds, m.operations, m.matched, m.counts, r.runs, m.created_at, m.updated_at
FROM recon_run_merchants m JOIN recon_runs r ON r.acquirer = m.acquirer AND r.period = m.period
WHERE m.merchant_id = $1 AND m.id = $2`, merchantID, id).Scan(&m.ID, &m.Acquirer, &m.Period, &m.MerchantID, &m.From, &m.To,
		&m.Charges, &m.Refunds, &m.Operations, &m.Matched, &counts, &m.Runs, &m.CreatedAt, &m.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return chargeonce.ReconMerchantRun{}, notFound
	}
	if err != nil {
		return chargeonce.ReconMerchantRun{}, fmt.Errorf("reading a merchant's share of a run: %w", translate(err))
	}
	if err := json.Unmarshal([]byte(counts), &m.Counts); err != nil {
		return chargeonce.ReconMerchantRun{}, fmt.Errorf("decoding run counts: %w", err)
	}
	m.From, m.To, m.CreatedAt, m.UpdatedAt = m.From.UTC(), m.To.UTC(), m.CreatedAt.UTC(), m.UpdatedAt.UTC()
	return m, nil
}

// ReconRunGet returns the stored run, or ENOTFOUND.
func (s *Store) ReconRunGet(ctx context.Context, acquirer, period string) (chargeonce.ReconRun, error) {
	if !chargeonce.ValidText(acquirer) || !chargeonce.ValidText(period) {
		return chargeonce.ReconRun{}, chargeonce.Errorf(chargeonce.ENOTFOUND, "no reconciliation run for %q %q", acquirer, period)
	}
	run, err := scanReconRun(s.pool.QueryRow(ctx,
		`SELECT `+reconRunColumns+` FROM recon_runs WHERE acquirer = $1 AND period = $2`, acquirer, period))
	if errors.Is(err, pgx.ErrNoRows) {
		return chargeonce.ReconRun{}, chargeonce.Errorf(chargeonce.ENOTFOUND, "no reconciliation run for %q %q", acquirer, period)
	}
	return run, err
}

const reconRunColumns = `acquirer, period, period_from, period_to, counts, report, runs, created_at, updated_at`

func scanReconRun(row pgx.Row) (chargeonce.ReconRun, error) {
	var (
		run    chargeonce.ReconRun
		counts string
	)
	err := row.Scan(&run.Acquirer, &run.Period, &run.From, &run.To, &counts, &run.Report, &run.Runs, &run.CreatedAt, &run.UpdatedAt)
	if err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return chargeonce.ReconRun{}, err
		}
		return chargeonce.ReconRun{}, fmt.Errorf("reading reconciliation run: %w", translate(err))
	}
	if err := json.Unmarshal([]byte(counts), &run.Counts); err != nil {
		return chargeonce.ReconRun{}, fmt.Errorf("decoding run counts: %w", err)
	}
	run.From, run.To = run.From.UTC(), run.To.UTC()
	return run, nil
}

// RefundsListByChargeReference returns one page of the refunds created in
// [p.From, p.To), in (charge_id, id) order, after (p.AfterCharge,
// p.AfterID). It walks refunds_charge_reference (migration 0020) from the
// cursor, below p.ChargeMax when given, and filters on created_at: a run
// reads the index once, proportional to the refunds of the charges up to
// the period's end rather than to the period's own.
func (s *Store) RefundsListByChargeReference(ctx context.Context, p chargeonce.ReconRefundsParams) ([]chargeonce.Refund, error) {
	if p.Limit <= 0 || p.Limit > chargeonce.ReconMaxPage {
		return nil, chargeonce.FieldError("limit", "limit must be 1 to %d; got %d", chargeonce.ReconMaxPage, p.Limit)
	}
	if !chargeonce.ValidText(p.AfterCharge) || !chargeonce.ValidText(p.AfterID) || !chargeonce.ValidText(p.ChargeMax) {
		return nil, chargeonce.FieldError("after", "the cursor and bounds must be valid UTF-8 without U+0000")
	}
	q, args := refundSelect+`
WHERE (r.charge_id, r.id) > ($1, $2) AND r.created_at >= $3 AND r.created_at < $4
ORDER BY r.charge_id, r.id LIMIT $5`, []any{p.AfterCharge, p.AfterID, p.From, p.To, p.Limit}
	if p.ChargeMax != "" {
		q, args = refundSelect+`
WHERE (r.charge_id, r.id) > ($1, $2) AND r.charge_id < $6 AND r.created_at >= $3 AND r.created_at < $4
ORDER BY r.charge_id, r.id LIMIT $5`, append(args, p.ChargeMax)
	}
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("listing refunds by charge reference: %w", translate(err))
	}
	refunds, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (chargeonce.Refund, error) { return scanRefund(row) })
	if err != nil {
		return nil, fmt.Errorf("listing refunds by charge reference: %w", translate(err))
	}
	for i := range refunds {
		refunds[i].CreatedAt = refunds[i].CreatedAt.UTC()
	}
	return refunds, nil
}

var _ chargeonce.ReconOps = (*Store)(nil)

// ReconRunsList returns the latest runs, most recently run first.
func (s *Store) ReconRunsList(ctx context.Context, limit int) ([]chargeonce.ReconRun, error) {
	rows, err := s.pool.Query(ctx, `SELECT acquirer, period, period_from, period_to, counts, ''::bytea, runs, created_at, updated_at
FROM recon_runs ORDER BY updated_at DESC, acquirer, period LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("listing reconciliation runs: %w", translate(err))
	}
	runs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (chargeonce.ReconRun, error) { return scanReconRun(row) })
	if err != nil {
		return nil, fmt.Errorf("listing reconciliation runs: %w", translate(err))
	}
	return runs, nil
}

// ReconAckInsert records the acknowledgement, or returns the first one.
func (s *Store) ReconAckInsert(ctx context.Context, a chargeonce.ReconAck) (chargeonce.ReconAck, error) {
	for _, v := range []string{a.Acquirer, a.Period, a.Type, a.Reference, a.ObjectReference, a.Actor, a.Note} {
		if !chargeonce.ValidText(v) {
			return chargeonce.ReconAck{}, chargeonce.FieldError("note", "an acknowledgement must be valid UTF-8 without U+0000")
		}
	}
	if _, err := s.pool.Exec(ctx, `INSERT INTO recon_acks (acquirer, period, type, reference, object_reference, actor, note)
VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING`, a.Acquirer, a.Period, a.Type, a.Reference, a.ObjectReference, a.Actor, a.Note); err != nil {
		return chargeonce.ReconAck{}, fmt.Errorf("acknowledging an exception: %w", translate(err))
	}
	var got chargeonce.ReconAck
	err := s.pool.QueryRow(ctx, `SELECT `+reconAckColumns+` FROM recon_acks
WHERE acquirer = $1 AND period = $2 AND type = $3 AND reference = $4 AND object_reference = $5`,
		a.Acquirer, a.Period, a.Type, a.Reference, a.ObjectReference).Scan(
		&got.Acquirer, &got.Period, &got.Type, &got.Reference, &got.ObjectReference, &got.Actor, &got.Note, &got.At)
	if err != nil {
		return chargeonce.ReconAck{}, fmt.Errorf("reading an acknowledgement: %w", translate(err))
	}
	got.At = got.At.UTC()
	return got, nil
}

// ReconAcksList returns the run's acknowledgements, oldest first.
func (s *Store) ReconAcksList(ctx context.Context, acquirer, period string) ([]chargeonce.ReconAck, error) {
	if !chargeonce.ValidText(acquirer) || !chargeonce.ValidText(period) {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, `SELECT `+reconAckColumns+` FROM recon_acks WHERE acquirer = $1 AND period = $2 ORDER BY at, type, reference`, acquirer, period)
	if err != nil {
		return nil, fmt.Errorf("listing acknowledgements: %w", translate(err))
	}
	acks, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (chargeonce.ReconAck, error) {
		var a chargeonce.ReconAck
		err := row.Scan(&a.Acquirer, &a.Period, &a.Type, &a.Reference, &a.ObjectReference, &a.Actor, &a.Note, &a.At)
		a.At = a.At.UTC()
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("listing acknowledgements: %w", translate(err))
	}
	return acks, nil
}

const reconAckColumns = `acquirer, period, type, reference, object_reference, actor, note, at`
