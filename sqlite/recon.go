package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/chargeonce/chargeonce"
)

var _ chargeonce.ReconStore = (*Store)(nil)

// ChargesListByReference returns one page of the charges created in
// [p.From, p.To), in id order (SQLite's BINARY collation is byte order, as
// Go compares strings), after p.After, within [p.IDMin, p.IDMax) when
// given. Like the PostgreSQL store it walks the primary key from the
// cursor and filters on created_at, adding no index to charges.
func (s *Store) ChargesListByReference(ctx context.Context, p chargeonce.ReconChargesParams) ([]chargeonce.Charge, error) {
	if p.Limit <= 0 || p.Limit > chargeonce.ReconMaxPage {
		return nil, chargeonce.FieldError("limit", "limit must be 1 to %d; got %d", chargeonce.ReconMaxPage, p.Limit)
	}
	// An empty IDMax is no upper bound; with one, the range scan stops there.
	q, args := sqlChargesByReference, []any{p.After, p.From.UnixMicro(), p.To.UnixMicro(), p.Limit, p.IDMin}
	if p.IDMax != "" {
		q, args = sqlChargesByReferenceBelow, append(args, p.IDMax)
	}
	rows, err := s.rdb.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, wrap("listing charges by reference", err)
	}
	defer rows.Close()
	charges := make([]chargeonce.Charge, 0, min(p.Limit, 64))
	for rows.Next() {
		var r chargeRow
		if err := rows.Scan(r.dest()...); err != nil {
			return nil, wrap("listing charges by reference", err)
		}
		charges = append(charges, r.charge())
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("listing charges by reference", err)
	}
	return charges, nil
}

const (
	sqlChargesByReference = `SELECT ` + chargeColumnsC + ` FROM charges c
WHERE c.id > ?1 AND c.id >= ?5 AND c.created_at >= ?2 AND c.created_at < ?3
ORDER BY c.id LIMIT ?4`
	sqlChargesByReferenceBelow = `SELECT ` + chargeColumnsC + ` FROM charges c
WHERE c.id > ?1 AND c.id >= ?5 AND c.id < ?6 AND c.created_at >= ?2 AND c.created_at < ?3
ORDER BY c.id LIMIT ?4`
)

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
	for _, m := range run.Merchants {
		if !chargeonce.ValidText(m.MerchantID) || m.MerchantID == "" {
			return chargeonce.ReconRun{}, chargeonce.FieldError("merchant_id", "a merchant's share needs a merchant id of valid text")
		}
	}
	var saved chargeonce.ReconRun
	err = s.write(ctx, "storing reconciliation run", func(ctx context.Context, tx *sql.Tx) error {
		var err error
		saved, err = scanReconRun(tx.QueryRowContext(ctx, `INSERT INTO recon_runs
		(acquirer, period, period_from, period_to, counts, report, runs, created_at, updated_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, 1, `+nowMicros+`, `+nowMicros+`)
ON CONFLICT (acquirer, period) DO UPDATE SET
		period_from = excluded.period_from, period_to = excluded.period_to,
		counts = excluded.counts, report = excluded.report,
		runs = recon_runs.runs + 1, updated_at = excluded.updated_at
RETURNING `+reconRunColumns, run.Acquirer, run.Period, run.From.UnixMicro(), run.To.UnixMicro(), string(counts), report))
		if err != nil {
			return err
		}
		for _, m := range run.Merchants {
			mc, err := json.Marshal(m.Counts)
			if err != nil {
				return fmt.Errorf("encoding run counts: %w", err)
			}
			id := chargeonce.ReconMerchantRunID(run.Acquirer, run.Period, m.MerchantID)
			// The event is written with the share's first insert: a re-run
			// updates the share and finds the event there.
			if _, err := tx.ExecContext(ctx, `INSERT INTO recon_run_merchants
	(acquirer, period, merchant_id, id, charges, refunds, matched, counts, operations, created_at, updated_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, `+nowMicros+`, `+nowMicros+`)
ON CONFLICT (acquirer, period, merchant_id) DO UPDATE SET
	charges = excluded.charges, refunds = excluded.refunds, matched = excluded.matched,
	counts = excluded.counts, operations = excluded.operations, updated_at = excluded.updated_at`,
				run.Acquirer, run.Period, m.MerchantID, id, m.Charges, m.Refunds, m.Matched, string(mc), m.Operations); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `INSERT OR IGNORE INTO webhook_events (id, merchant_id, charge_id, object_id, type, created_at)
VALUES ('evt_' || ?1, ?2, ?1, ?1, ?3, `+nowMicros+`)`, id, m.MerchantID, chargeonce.EventReconciliationCompleted); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return chargeonce.ReconRun{}, err
	}
	saved.Merchants = run.Merchants
	return saved, nil
}

// ReconMerchantRunGet returns the merchant's share of a run by its id.
func (s *Store) ReconMerchantRunGet(ctx context.Context, merchantID, id string) (chargeonce.ReconMerchantRun, error) {
	var (
		m                          chargeonce.ReconMerchantRun
		counts                     string
		from, to, created, updated int64
	)
	err := s.rdb.QueryRowContext(ctx, `SELECT m.id, m.acquirer, m.period, m.merchant_id, r.period_from, r.period_to,
	m.charges, m.refunds, m.operations, m.matched, m.counts, r.runs, m.created_at, m.updated_at
FROM recon_run_merchants m JOIN recon_runs r ON r.acquirer = m.acquirer AND r.period = m.period
WHERE m.merchant_id = ?1 AND m.id = ?2`, merchantID, id).Scan(&m.ID, &m.Acquirer, &m.Period, &m.MerchantID, &from, &to,
		&m.Charges, &m.Refunds, &m.Operations, &m.Matched, &counts, &m.Runs, &created, &updated)
	if errors.Is(err, sql.ErrNoRows) {
		return chargeonce.ReconMerchantRun{}, chargeonce.Errorf(chargeonce.ENOTFOUND, "reconciliation run %q not found", id)
	}
	if err != nil {
		return chargeonce.ReconMerchantRun{}, wrap("reading a merchant's share of a run", err)
	}
	if err := json.Unmarshal([]byte(counts), &m.Counts); err != nil {
		return chargeonce.ReconMerchantRun{}, fmt.Errorf("decoding run counts: %w", err)
	}
	m.From, m.To, m.CreatedAt, m.UpdatedAt = fromMicros(from), fromMicros(to), fromMicros(created), fromMicros(updated)
	return m, nil
}

// ReconRunGet returns the stored run, or ENOTFOUND.
func (s *Store) ReconRunGet(ctx context.Context, acquirer, period string) (chargeonce.ReconRun, error) {
	run, err := scanReconRun(s.rdb.QueryRowContext(ctx,
		`SELECT `+reconRunColumns+` FROM recon_runs WHERE acquirer = ?1 AND period = ?2`, acquirer, period))
	if errors.Is(err, sql.ErrNoRows) {
		return chargeonce.ReconRun{}, chargeonce.Errorf(chargeonce.ENOTFOUND, "no reconciliation run for %q %q", acquirer, period)
	}
	return run, err
}

const reconRunColumns = `acquirer, period, period_from, period_to, counts, report, runs, created_at, updated_at`

func scanReconRun(row *sql.Row) (chargeonce.ReconRun, error) {
	var (
		run                        chargeonce.ReconRun
		counts                     string
		from, to, created, updated int64
	)
	err := row.Scan(&run.Acquirer, &run.Period, &from, &to, &counts, &run.Report, &run.Runs, &created, &updated)
	if errors.Is(err, sql.ErrNoRows) {
		return chargeonce.ReconRun{}, err
	}
	if err != nil {
		return chargeonce.ReconRun{}, wrap("reading reconciliation run", err)
	}
	if err := json.Unmarshal([]byte(counts), &run.Counts); err != nil {
		return chargeonce.ReconRun{}, fmt.Errorf("decoding run counts: %w", err)
	}
	run.From, run.To, run.CreatedAt, run.UpdatedAt = fromMicros(from), fromMicros(to), fromMicros(created), fromMicros(updated)
	return run, nil
}

// RefundsListByChargeReference returns one page of the refunds created in
// [p.From, p.To), in (charge_id, id) order, after (p.AfterCharge,
// p.AfterID), walking refunds_charge_reference (migration 0020) from the
// cursor, below p.ChargeMax when given.
func (s *Store) RefundsListByChargeReference(ctx context.Context, p chargeonce.ReconRefundsParams) ([]chargeonce.Refund, error) {
	if p.Limit <= 0 || p.Limit > chargeonce.ReconMaxPage {
		return nil, chargeonce.FieldError("limit", "limit must be 1 to %d; got %d", chargeonce.ReconMaxPage, p.Limit)
	}
	q, args := sqlRefundsByChargeReference, []any{p.AfterCharge, p.AfterID, p.From.UnixMicro(), p.To.UnixMicro(), p.Limit}
	if p.ChargeMax != "" {
		q, args = sqlRefundsByChargeReferenceBelow, append(args, p.ChargeMax)
	}
	rows, err := s.rdb.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, wrap("listing refunds by charge reference", err)
	}
	defer rows.Close()
	refunds := make([]chargeonce.Refund, 0, min(p.Limit, 64))
	for rows.Next() {
		var r refundRow
		if err := rows.Scan(r.nullDest()...); err != nil {
			return nil, wrap("listing refunds by charge reference", err)
		}
		refunds = append(refunds, r.refund())
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("listing refunds by charge reference", err)
	}
	return refunds, nil
}

const (
	sqlRefundsByChargeReference = `SELECT ` + refundColumnsR + ` FROM refunds r INDEXED BY refunds_charge_reference
WHERE (r.charge_id, r.id) > (?1, ?2) AND r.created_at >= ?3 AND r.created_at < ?4
ORDER BY r.charge_id, r.id LIMIT ?5`
	sqlRefundsByChargeReferenceBelow = `SELECT ` + refundColumnsR + ` FROM refunds r INDEXED BY refunds_charge_reference
WHERE (r.charge_id, r.id) > (?1, ?2) AND r.charge_id < ?6 AND r.created_at >= ?3 AND r.created_at < ?4
ORDER BY r.charge_id, r.id LIMIT ?5`
)

var _ chargeonce.ReconOps = (*Store)(nil)

// ReconRunsList returns the latest runs, most recently run first.
func (s *Store) ReconRunsList(ctx context.Context, limit int) ([]chargeonce.ReconRun, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT acquirer, period, period_from, period_to, counts, runs, created_at, updated_at
FROM recon_runs ORDER BY updated_at DESC, acquirer, period LIMIT ?1`, limit)
	if err != nil {
		return nil, wrap("listing reconciliation runs", err)
	}
	defer rows.Close()
	var runs []chargeonce.ReconRun
	for rows.Next() {
		var (
			run                        chargeonce.ReconRun
			counts                     string
			from, to, created, updated int64
		)
		if err := rows.Scan(&run.Acquirer, &run.Period, &from, &to, &counts, &run.Runs, &created, &updated); err != nil {
			return nil, wrap("listing reconciliation runs", err)
		}
		if err := json.Unmarshal([]byte(counts), &run.Counts); err != nil {
			return nil, fmt.Errorf("decoding run counts: %w", err)
		}
		run.From, run.To, run.CreatedAt, run.UpdatedAt = fromMicros(from), fromMicros(to), fromMicros(created), fromMicros(updated)
		runs = append(runs, run)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("listing reconciliation runs", err)
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
	err := s.write(ctx, "acknowledging an exception", func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO recon_acks (acquirer, period, type, reference, object_reference, actor, note, at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, `+nowMicros+`) ON CONFLICT DO NOTHING`, a.Acquirer, a.Period, a.Type, a.Reference, a.ObjectReference, a.Actor, a.Note)
		return err
	})
	if err != nil {
		return chargeonce.ReconAck{}, err
	}
	var (
		got chargeonce.ReconAck
		at  int64
	)
	if err := s.rdb.QueryRowContext(ctx, `SELECT `+reconAckColumns+` FROM recon_acks
WHERE acquirer = ?1 AND period = ?2 AND type = ?3 AND reference = ?4 AND object_reference = ?5`,
		a.Acquirer, a.Period, a.Type, a.Reference, a.ObjectReference).Scan(
		&got.Acquirer, &got.Period, &got.Type, &got.Reference, &got.ObjectReference, &got.Actor, &got.Note, &at); err != nil {
		return chargeonce.ReconAck{}, wrap("reading an acknowledgement", err)
	}
	got.At = fromMicros(at)
	return got, nil
}

// ReconAcksList returns the run's acknowledgements, oldest first.
func (s *Store) ReconAcksList(ctx context.Context, acquirer, period string) ([]chargeonce.ReconAck, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT `+reconAckColumns+` FROM recon_acks WHERE acquirer = ?1 AND period = ?2 ORDER BY at, type, reference`, acquirer, period)
	if err != nil {
		return nil, wrap("listing acknowledgements", err)
	}
	defer rows.Close()
	var acks []chargeonce.ReconAck
	for rows.Next() {
		var (
			a  chargeonce.ReconAck
			at int64
		)
		if err := rows.Scan(&a.Acquirer, &a.Period, &a.Type, &a.Reference, &a.ObjectReference, &a.Actor, &a.Note, &at); err != nil {
			return nil, wrap("listing acknowledgements", err)
		}
		a.At = fromMicros(at)
		acks = append(acks, a)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("listing acknowledgements", err)
	}
	return acks, nil
}

const reconAckColumns = `acquirer, period, type, reference, object_reference, actor, note, at`
