package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/chargeonce/chargeonce"
)

var _ chargeonce.OperatorStore = (*Store)(nil)

// historyColumnsH are the columns scanHistory reads (charge_history "h").
const historyColumnsH = `h.id, h.charge_id, h.merchant_id, h.at, h.kind, h.actor, h.outcome, h.detail, h.reason, h.forced`

// historyRow scans historyColumnsH, all nullable (a LEFT JOIN may find none).
type historyRow struct {
	id                                sql.NullInt64
	chargeID, merchantID, kind, actor sql.NullString
	outcome, detail, reason           sql.NullString
	at                                sql.NullInt64
	forced                            sql.NullBool
}

func (h *historyRow) dest() []any {
	return []any{&h.id, &h.chargeID, &h.merchantID, &h.at, &h.kind, &h.actor, &h.outcome, &h.detail, &h.reason, &h.forced}
}

func (h *historyRow) entry() *chargeonce.HistoryEntry {
	if !h.id.Valid {
		return nil
	}
	return &chargeonce.HistoryEntry{
		ID: h.id.Int64, ChargeID: h.chargeID.String, MerchantID: h.merchantID.String,
		At: fromMicros(h.at.Int64), Kind: chargeonce.HistoryKind(h.kind.String), Actor: h.actor.String,
		Outcome: h.outcome.String, Detail: h.detail.String, Reason: h.reason.String, Forced: h.forced.Bool,
	}
}

// ChargesListStuck pages through the processing records of every merchant
// and of every kind (a charge's; a refund's, a manual capture's or a
// cancel's with its charge), oldest first, with each one's newest history entry and whether a live lease
// holds it (computed in the statement; such records are left out unless
// p.IncludeLeased). The partial index on lease_until holds only processing
// records, which are few.
func (s *Store) ChargesListStuck(ctx context.Context, p chargeonce.StuckListParams) (chargeonce.StuckPage, error) {
	if err := p.Check(); err != nil {
		return chargeonce.StuckPage{}, err
	}
	var afterAt sql.NullInt64
	if p.After != "" {
		err := s.rdb.QueryRowContext(ctx, `
SELECT created_at FROM charges WHERE id = ?1
UNION ALL SELECT created_at FROM refunds WHERE id = ?1
UNION ALL SELECT created_at FROM charge_operations WHERE id = ?1`, p.After).Scan(&afterAt)
		if errors.Is(err, sql.ErrNoRows) {
			return chargeonce.StuckPage{}, chargeonce.FieldError("after", "after must be the id of a charge, a refund, a capture or a cancel; %q is not", p.After)
		}
		if err != nil {
			return chargeonce.StuckPage{}, wrap("listing stuck charges", err)
		}
	}
	rows, err := s.rdb.QueryContext(ctx, `
SELECT `+chargeColumnsC+`,
	`+nowMicros+` - coalesce(r.created_at, o.created_at, c.created_at), k.recovery_attempts, k.lease_until,
	k.lease_held AND k.lease_until > `+nowMicros+`,
	r.id, r.amount_cents, r.currency, r.status, r.reason, r.created_at, `+operationColumnsO+`, `+historyColumnsH+`
`+keysFrom+`
LEFT JOIN charge_history h ON h.id = (
	SELECT max(hh.id) FROM charge_history hh WHERE hh.charge_id = k.charge_id)
WHERE k.state = 'processing'
	AND (?1 = '' OR k.merchant_id = ?1)
	AND coalesce(r.created_at, o.created_at, c.created_at) <= `+nowMicros+` - ?2
	AND (?3 IS NULL OR coalesce(r.created_at, o.created_at, c.created_at) > ?3
		OR (coalesce(r.created_at, o.created_at, c.created_at) = ?3 AND k.charge_id > ?4))
	AND (?6 OR NOT (k.lease_held AND k.lease_until > `+nowMicros+`))
ORDER BY coalesce(r.created_at, o.created_at, c.created_at), k.charge_id
LIMIT ?5`, p.MerchantID, micros(p.OlderThan), afterAt, p.After, p.Limit+1, p.IncludeLeased)
	if err != nil {
		return chargeonce.StuckPage{}, wrap("listing stuck charges", err)
	}
	defer rows.Close()
	var page chargeonce.StuckPage
	for rows.Next() {
		var (
			cr                            chargeRow
			h                             historyRow
			age, lease                    int64
			attempts                      int
			inFlight                      bool
			rID, rCurrency, rStatus, rWhy sql.NullString
			rAmount, rAt                  sql.NullInt64
			op                            operationRow
		)
		dest := append(cr.dest(), &age, &attempts, &lease, &inFlight, &rID, &rAmount, &rCurrency, &rStatus, &rWhy, &rAt)
		dest = append(dest, op.nullDest()...)
		if err := rows.Scan(append(dest, h.dest()...)...); err != nil {
			return chargeonce.StuckPage{}, wrap("listing stuck charges", err)
		}
		sc := chargeonce.StuckCharge{
			Charge: cr.charge(), Age: time.Duration(age) * time.Microsecond,
			Attempts: attempts, NextAttempt: fromMicros(lease), Last: h.entry(), InFlight: inFlight,
			Operation: op.operationOrNil(),
		}
		if rID.Valid {
			sc.Refund = &chargeonce.Refund{
				ID: rID.String, MerchantID: sc.Charge.MerchantID, ChargeID: sc.Charge.ID, AmountCents: rAmount.Int64,
				Currency: rCurrency.String, Status: chargeonce.RefundStatus(rStatus.String), Reason: rWhy.String,
				CreatedAt: fromMicros(rAt.Int64),
			}
		}
		page.Charges = append(page.Charges, sc)
	}
	if err := rows.Err(); err != nil {
		return chargeonce.StuckPage{}, wrap("listing stuck charges", err)
	}
	if len(page.Charges) > p.Limit {
		page.Charges, page.HasMore = page.Charges[:p.Limit], true
	}
	return page, nil
}

// ChargeInspect reads any merchant's charge by id with its record, if the
// record is still there.
func (s *Store) ChargeInspect(ctx context.Context, id string) (chargeonce.ChargeInspection, error) {
	return s.inspect(ctx, s.rdb.QueryRowContext, id)
}

func (s *Store) inspect(ctx context.Context, query func(context.Context, string, ...any) *sql.Row, id string) (chargeonce.ChargeInspection, error) {
	if !chargeonce.ValidText(id) {
		return chargeonce.ChargeInspection{}, chargeonce.Errorf(chargeonce.ENOTFOUND, "charge %q not found", id)
	}
	var (
		in              chargeonce.ChargeInspection
		cr              chargeRow
		updated, age    int64
		state           sql.NullString
		attempts, lease sql.NullInt64
		inFlight        sql.NullBool
	)
	err := query(ctx, `
SELECT `+chargeColumnsC+`, c.updated_at, `+nowMicros+` - c.created_at, k.state, k.recovery_attempts, k.lease_until,
	k.state = 'processing' AND k.lease_held AND k.lease_until > `+nowMicros+`
FROM charges c
LEFT JOIN idempotency_keys k ON k.merchant_id = c.merchant_id AND k.key = c.idempotency_key AND k.charge_id = c.id
WHERE c.id = ?1`, id).Scan(append(cr.dest(), &updated, &age, &state, &attempts, &lease, &inFlight)...)
	if errors.Is(err, sql.ErrNoRows) {
		return chargeonce.ChargeInspection{}, chargeonce.Errorf(chargeonce.ENOTFOUND, "charge %q not found", id)
	}
	if err != nil {
		return chargeonce.ChargeInspection{}, wrap("inspecting charge", err)
	}
	in.Charge, in.UpdatedAt, in.Age = cr.charge(), fromMicros(updated), time.Duration(age)*time.Microsecond
	in.RecordInspection = inspectedRecord(state, attempts, lease, inFlight)
	return in, nil
}

// inspectedRecord is what an inspected object's record says, from its
// LEFT JOINed columns (all NULL once it has been swept).
func inspectedRecord(state sql.NullString, attempts, lease sql.NullInt64, inFlight sql.NullBool) chargeonce.RecordInspection {
	if !state.Valid {
		return chargeonce.RecordInspection{}
	}
	return chargeonce.RecordInspection{HasRecord: true, State: chargeonce.KeyState(state.String),
		Attempts: int(attempts.Int64), NextAttempt: fromMicros(lease.Int64), InFlight: inFlight.Bool}
}

// OperationInspect reads any merchant's capture or cancel by id, with its
// charge and its record, if the record is still there.
func (s *Store) OperationInspect(ctx context.Context, id string) (chargeonce.OperationInspection, error) {
	what := objectName(id)
	if !chargeonce.ValidText(id) {
		return chargeonce.OperationInspection{}, chargeonce.Errorf(chargeonce.ENOTFOUND, "%s %q not found", what, id)
	}
	var (
		in              chargeonce.OperationInspection
		op              operationRow
		cr              chargeRow
		updated, age    int64
		state           sql.NullString
		attempts, lease sql.NullInt64
		inFlight        sql.NullBool
	)
	dest := append(op.nullDest(), &updated, &age)
	dest = append(dest, cr.dest()...)
	err := s.rdb.QueryRowContext(ctx, `
SELECT `+operationColumnsO+`, o.updated_at, `+nowMicros+` - o.created_at, `+chargeColumnsC+`,
	k.state, k.recovery_attempts, k.lease_until,
	k.state = 'processing' AND k.lease_held AND k.lease_until > `+nowMicros+`
FROM charge_operations o
JOIN charges c ON c.id = o.charge_id
LEFT JOIN idempotency_keys k ON k.merchant_id = o.merchant_id AND k.key = o.idempotency_key AND k.charge_id = o.id
WHERE o.id = ?1`, id).Scan(append(dest, &state, &attempts, &lease, &inFlight)...)
	if errors.Is(err, sql.ErrNoRows) {
		return chargeonce.OperationInspection{}, chargeonce.Errorf(chargeonce.ENOTFOUND, "%s %q not found", what, id)
	}
	if err != nil {
		return chargeonce.OperationInspection{}, wrap("inspecting a "+what, err)
	}
	in.Operation, in.Charge = *op.operationOrNil(), cr.charge()
	in.UpdatedAt, in.Age = fromMicros(updated), time.Duration(age)*time.Microsecond
	in.RecordInspection = inspectedRecord(state, attempts, lease, inFlight)
	return in, nil
}

// ChargeOperations lists the capture or cancel that holds a charge
// (pending or succeeded: at most one), by the partial unique index
// charge_operations_one_live; failed ones are not read.
func (s *Store) ChargeOperations(ctx context.Context, chargeID string) ([]chargeonce.Operation, error) {
	rows, err := s.rdb.QueryContext(ctx, `
SELECT `+operationColumnsO+` FROM charge_operations o WHERE o.charge_id = ?1 AND o.status <> 'failed'
ORDER BY o.created_at DESC, o.id DESC LIMIT ?2`, chargeID, chargeonce.StuckListMaxLimit)
	if err != nil {
		return nil, wrap("listing a charge's operations", err)
	}
	defer rows.Close()
	var out []chargeonce.Operation
	for rows.Next() {
		var op operationRow
		if err := rows.Scan(op.nullDest()...); err != nil {
			return nil, wrap("listing a charge's operations", err)
		}
		out = append(out, *op.operationOrNil())
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("listing a charge's operations", err)
	}
	return out, nil
}

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

// ChargeHistory returns a charge's appended entries, oldest first.
func (s *Store) ChargeHistory(ctx context.Context, chargeID string) ([]chargeonce.HistoryEntry, error) {
	return s.historyQuery(ctx, "reading charge history", `
SELECT `+historyColumnsH+` FROM charge_history h WHERE h.charge_id = ?1 ORDER BY h.id`, chargeID)
}

// AuditList returns resolutions, newest first.
func (s *Store) AuditList(ctx context.Context, p chargeonce.AuditListParams) ([]chargeonce.HistoryEntry, error) {
	if err := p.Check(); err != nil {
		return nil, err
	}
	return s.historyQuery(ctx, "reading the audit trail", `
SELECT `+historyColumnsH+` FROM charge_history h
WHERE h.kind IN ('resolution', 'resolve-refused') AND (?1 = 0 OR h.id < ?1)
ORDER BY h.id DESC LIMIT ?2`, p.Before, p.Limit)
}

func (s *Store) historyQuery(ctx context.Context, what, query string, args ...any) ([]chargeonce.HistoryEntry, error) {
	rows, err := s.rdb.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, wrap(what, err)
	}
	defer rows.Close()
	out := []chargeonce.HistoryEntry{}
	for rows.Next() {
		var h historyRow
		if err := rows.Scan(h.dest()...); err != nil {
			return nil, wrap(what, err)
		}
		out = append(out, *h.entry())
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(what, err)
	}
	return out, nil
}

// historyInsert appends entries in one statement of tx.
func historyInsert(ctx context.Context, tx *sql.Tx, entries []chargeonce.HistoryEntry) error {
	var (
		sb   strings.Builder
		args []any
	)
	sb.WriteString(`INSERT INTO charge_history (charge_id, merchant_id, at, kind, actor, outcome, detail, reason, forced) VALUES `)
	for i := range entries {
		e := &entries[i]
		if err := e.CheckText(); err != nil {
			return err
		}
		if i > 0 {
			sb.WriteString(", ")
		}
		fmt.Fprintf(&sb, "(?, ?, %s, ?, ?, ?, ?, ?, ?)", nowMicros)
		args = append(args, e.ChargeID, e.MerchantID, string(e.Kind), e.Actor, e.Outcome, e.Detail, e.Reason, e.Forced)
	}
	_, err := tx.ExecContext(ctx, sb.String(), args...)
	return err
}

// HistoryAppend appends entries in one statement.
func (s *Store) HistoryAppend(ctx context.Context, entries ...chargeonce.HistoryEntry) error {
	if len(entries) == 0 {
		return nil
	}
	for i := range entries {
		if err := entries[i].CheckText(); err != nil {
			return err
		}
	}
	return s.write(ctx, "appending charge history", func(ctx context.Context, tx *sql.Tx) error {
		if err := historyInsert(ctx, tx, entries); err != nil {
			return wrap("appending charge history", err)
		}
		return nil
	})
}

// ChargeResolveClaim gives the processing record of a charge, of a refund
// (id re_…), or of a capture or cancel (cp_…, vd_…) to an operator's
// resolution when nobody drives it: its
// lease ended, or its owner let go and the rest is a back-off
// (lease_held). An attempt or recovery pass in flight keeps it (ELEASED):
// taking it over would let the resolution settle while that attempt's
// capture or refund may still land.
func (s *Store) ChargeResolveClaim(ctx context.Context, id, newToken string, lease time.Duration) (chargeonce.KeyRecord, error) {
	what := objectName(id)
	if !chargeonce.ValidText(id) {
		return chargeonce.KeyRecord{}, chargeonce.Errorf(chargeonce.ENOTFOUND, "%s %q not found", what, id)
	}
	// The record guarding id: a charge's, a refund's or an operation's.
	const objects = `
	SELECT merchant_id, idempotency_key FROM charges WHERE id = ?1
	UNION ALL SELECT merchant_id, idempotency_key FROM refunds WHERE id = ?1
	UNION ALL SELECT merchant_id, idempotency_key FROM charge_operations WHERE id = ?1`
	const guarding = `(merchant_id, key) IN (` + objects + `)
	AND charge_id = ?1 AND state = 'processing'`
	var rec chargeonce.KeyRecord
	err := s.write(ctx, "claiming a "+what+" for resolution", func(ctx context.Context, tx *sql.Tx) error {
		// The lease the claim takes over, read in the claim's write
		// transaction (one writer: nothing changes it in between).
		var quiet int64 // µs
		if err := tx.QueryRowContext(ctx, `
SELECT `+nowMicros+` - lease_until FROM idempotency_keys WHERE `+guarding, id).Scan(&quiet); err != nil && !errors.Is(err, sql.ErrNoRows) {
			return wrap("claiming a "+what+" for resolution", err)
		}
		var rowid int64
		err := tx.QueryRowContext(ctx, `
UPDATE idempotency_keys
SET token = ?2, lease_until = `+nowMicros+` + ?3, lease_held = 1, updated_at = `+nowMicros+`
WHERE `+guarding+`
	AND (lease_until <= `+nowMicros+` OR lease_held = 0)
RETURNING rowid`, id, newToken, micros(lease)).Scan(&rowid)
		if errors.Is(err, sql.ErrNoRows) {
			var remaining int64 // µs
			err := tx.QueryRowContext(ctx, `
SELECT max(0, lease_until - `+nowMicros+`) FROM idempotency_keys WHERE `+guarding, id).Scan(&remaining)
			if err == nil {
				return chargeonce.LeasedError(id, time.Duration(remaining)*time.Microsecond)
			}
			if !errors.Is(err, sql.ErrNoRows) {
				return wrap("claiming a "+what+" for resolution", err)
			}
			var exists bool
			if err := tx.QueryRowContext(ctx, `SELECT EXISTS (`+objects+`)`, id).Scan(&exists); err != nil {
				return wrap("claiming a "+what+" for resolution", err)
			}
			if !exists {
				return chargeonce.Errorf(chargeonce.ENOTFOUND, "%s %q not found", what, id)
			}
			return chargeonce.Errorf(chargeonce.ENOTPROCESSING, "%s %s is no longer processing", what, id)
		}
		if err != nil {
			return wrap("claiming a "+what+" for resolution", err)
		}
		rec, _, err = scanKey(tx.QueryRowContext(ctx, sqlKeySelectRowid, rowid))
		if err != nil {
			return wrap("claiming a "+what+" for resolution", err)
		}
		rec.Quiet = time.Duration(quiet) * time.Microsecond
		return nil
	})
	return rec, err
}

// ChargeResolve completes the record exactly as KeyComplete does
// (keyCompleteTx: whatever a completion writes besides the record, such as
// the queue outbox's row, it writes for a resolution too) and appends the
// audit entry, in one transaction.
func (s *Store) ChargeResolve(ctx context.Context, p chargeonce.ResolveParams) (chargeonce.HistoryEntry, error) {
	if err := p.Audit.CheckText(); err != nil {
		return chargeonce.HistoryEntry{}, err
	}
	q, err := s.prepared(ctx)
	if err != nil {
		return chargeonce.HistoryEntry{}, err
	}
	audit := p.Audit
	err = s.write(ctx, "resolving charge", func(ctx context.Context, tx *sql.Tx) error {
		if err := keyCompleteTx(ctx, tx, q, p.Complete); err != nil {
			return err
		}
		e := &p.Audit
		var at int64
		if err := tx.QueryRowContext(ctx, `INSERT INTO charge_history (charge_id, merchant_id, at, kind, actor, outcome, detail, reason, forced)
VALUES (?, ?, `+nowMicros+`, ?, ?, ?, ?, ?, ?) RETURNING id, at`,
			e.ChargeID, e.MerchantID, string(e.Kind), e.Actor, e.Outcome, e.Detail, e.Reason, e.Forced).Scan(&audit.ID, &at); err != nil {
			return wrap("writing the audit entry", err)
		}
		audit.At = fromMicros(at)
		return nil
	})
	if err != nil {
		return chargeonce.HistoryEntry{}, err
	}
	return audit, nil
}
