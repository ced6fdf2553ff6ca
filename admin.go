package chargeonce

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// Error codes of the operators' API (SPEC "Operators").
const (
	// ENOTPROCESSING: the charge an operator meant to resolve is no longer
	// processing (recovery, or a retry, settled it first); nothing changed.
	ENOTPROCESSING = "charge-not-processing"
	// EDISAGREES: the acquirer's lookup found a capture that contradicts
	// the operator's decision; nothing was settled. Sending force overrides.
	EDISAGREES = "acquirer-disagrees"
	// ELEASED: an attempt, recovery or another resolution is driving the
	// charge under a live lease; nothing changed. Retry after it ends.
	ELEASED = "charge-in-flight"
	// EUNSURE: the resolution's lookup failed, timed out or could not tell
	// what happened (a capture under way, a search that lags); nothing was
	// settled. Sending force overrides once no lease is live.
	EUNSURE = "acquirer-unsure"
)

// LeasedError is ChargeResolveClaim's refusal of a charge (or a refund,
// capture or cancel: id names it) driven under a lease that has remaining
// left (by the database's clock): ELEASED, with that time as RetryAfter
// (at least a second).
func LeasedError(id string, remaining time.Duration) error {
	what := "charge"
	switch {
	case strings.HasPrefix(id, "re_"):
		what = "refund"
	case strings.HasPrefix(id, "cp_"):
		what = "capture"
	case strings.HasPrefix(id, "vd_"):
		what = "cancel"
	}
	return &Error{Code: ELEASED, RetryAfter: max(remaining, time.Second),
		Message: fmt.Sprintf("%s %s is being driven by an attempt or recovery under a lease that ends in %s; nothing changed: resolve it after that",
			what, id, remaining.Round(time.Millisecond))}
}

// HistoryKind names what a charge's history entry records.
type HistoryKind string

// The kinds of history entries. Inserted and Settled are derived from the
// charge's record (the common path writes no history rows); the others are
// appended when they happen, on the paths that are not the common one.
const (
	HistoryInserted HistoryKind = "inserted"
	HistorySettled  HistoryKind = "settled"
	// HistoryCapture is an acquirer capture call off the common path (a
	// re-drive, or one whose outcome was unknown), with its outcome or
	// error.
	HistoryCapture HistoryKind = "capture"
	// HistoryLookup is a lookup of the reference at the acquirer.
	HistoryLookup HistoryKind = "lookup"
	// HistoryRecoveryClaim is recovery (or a retry past an expired lease)
	// taking a record over.
	HistoryRecoveryClaim HistoryKind = "recovery-claim"
	// HistoryResolution is an operator's resolution: the audit entry.
	HistoryResolution HistoryKind = "resolution"
	// HistoryResolveRefused is a resolution refused because the acquirer
	// disagreed.
	HistoryResolveRefused HistoryKind = "resolve-refused"
	// HistoryWebhook is one delivery attempt of the charge's settlement
	// event, read from the webhook tables (never stored as history).
	HistoryWebhook HistoryKind = "webhook"
)

// HistoryEntry is one step of a charge's history. Entries are
// append-only: no store method changes or deletes one.
type HistoryEntry struct {
	// ID orders entries; zero for derived entries.
	ID         int64
	ChargeID   string
	MerchantID string
	// At is the database's clock when the entry was written.
	At   time.Time
	Kind HistoryKind
	// Actor is who acted: "attempt", "recovery", or "admin:<name>".
	Actor string
	// Outcome is the short result: captured, declined, unsure,
	// safe-to-send, error; the status decided, for a resolution.
	Outcome string
	// Detail is the error, the lookup's reason, or for a resolution the
	// acquirer's answer to the lookup it made first.
	Detail string
	// Reason is the operator's reason, for resolutions.
	Reason string
	// Forced is set on a resolution made against the acquirer's answer.
	Forced bool
	// Derived is set on entries derived from the record, not stored.
	Derived bool
}

// Limits of a page of the operators' lists.
const (
	StuckListDefaultLimit = 50
	StuckListMaxLimit     = 200
)

// StuckListParams select a page of processing charges across merchants,
// oldest first (created_at, then id).
type StuckListParams struct {
	// MerchantID, when set, keeps one merchant's charges.
	MerchantID string
	// OlderThan keeps the charges created at least this long ago.
	OlderThan time.Duration
	// Limit is 1 to StuckListMaxLimit.
	Limit int
	// After, a charge id, asks for the charges after it (the next page).
	After string
	// IncludeLeased keeps the charges an attempt, recovery or a resolution
	// is driving right now, under a live lease (StuckCharge.InFlight).
	// They are left out by default: their outcome may still arrive, and a
	// resolution would be refused (ELEASED) until the lease ends.
	IncludeLeased bool
}

// StuckCharge is a processing charge as operators see it.
type StuckCharge struct {
	Charge Charge
	// Age is how long the charge has been processing, by the database's
	// clock.
	Age time.Duration
	// Attempts counts the acquirer attempts that ended without an answer
	// (the record's recovery attempts).
	Attempts int
	// NextAttempt is when the record's lease (or back-off) ends and
	// recovery may drive it again.
	NextAttempt time.Time
	// Last is the newest appended history entry, if any.
	Last *HistoryEntry
	// InFlight is set while an attempt, recovery or a resolution drives
	// the record under a live lease (it holds the lease, and the lease has
	// not ended by the database's clock): its acquirer call may still be
	// answered. A record backed off by recovery is not in flight.
	InFlight bool
	// Refund is set when the stuck operation is a refund of Charge (Kind
	// KindRefund); Age, Attempts, NextAttempt and Last are then the
	// refund's. Nil for a charge.
	Refund *Refund
	// Operation is set when the stuck operation is a manual capture or a
	// cancel (void) of Charge, which is then authorized (Kind KindCapture
	// or KindCancel); Age, Attempts, NextAttempt and Last are then the
	// operation's. Nil otherwise.
	Operation *Operation
}

// Kind is the kind of the stuck operation.
func (c *StuckCharge) Kind() RecordKind {
	switch {
	case c.Operation != nil:
		return c.Operation.Kind
	case c.Refund != nil:
		return KindRefund
	}
	return KindCharge
}

// ObjectID is the id of the stuck operation (ch_…, re_…, cp_… or vd_…).
func (c *StuckCharge) ObjectID() string {
	switch {
	case c.Operation != nil:
		return c.Operation.ID
	case c.Refund != nil:
		return c.Refund.ID
	}
	return c.Charge.ID
}

// StuckPage is one page of the stuck list.
type StuckPage struct {
	Charges []StuckCharge
	HasMore bool
}

// ChargeInspection is a charge of any merchant with what its record says.
type ChargeInspection struct {
	Charge Charge
	// UpdatedAt is when the charge last changed: its settlement, once it is
	// not processing.
	UpdatedAt time.Time
	// Age is now - created_at by the database's clock.
	Age time.Duration
	RecordInspection
}

// OperationInspection is a capture or a cancel of any merchant's
// authorized charge, with its charge and what its record says.
type OperationInspection struct {
	Operation Operation
	// Charge is the authorization the operation settles.
	Charge Charge
	// UpdatedAt is when the operation last changed: its settlement, once
	// it is not pending.
	UpdatedAt time.Time
	// Age is now - the operation's created_at by the database's clock.
	Age time.Duration
	RecordInspection
}

// RecordInspection is what an inspected object's idempotency record says,
// when it is still there.
type RecordInspection struct {
	// HasRecord tells whether the idempotency record still exists (a
	// completed one is swept after its TTL).
	HasRecord   bool
	State       KeyState
	Attempts    int
	NextAttempt time.Time
	// InFlight is set while an attempt, recovery or a resolution drives
	// the processing record under a live lease (see StuckCharge.InFlight).
	InFlight bool
}

// ResolveParams settle a processing charge as an operator decided: the
// final answer is stored exactly as KeyComplete stores it (so retries replay
// it and the queue outbox publishes it), and Audit is appended in the same
// transaction.
type ResolveParams struct {
	Complete KeyCompleteParams
	Audit    HistoryEntry
}

// AuditListParams select a page of resolutions and refused resolutions,
// newest first.
type AuditListParams struct {
	Limit int
	// Before, an entry id, asks for the entries older than it.
	Before int64
}

// HistoryAppender appends entries to charges' histories. The engine
// appends the unusual paths' steps through it.
type HistoryAppender interface {
	HistoryAppend(ctx context.Context, entries ...HistoryEntry) error
}

// OperatorStore is what operators need of a store (SPEC "Operators"). Both
// stores implement it; storetest.RunOperators checks them.
type OperatorStore interface {
	// ChargesListStuck returns a page of processing records across
	// merchants and kinds (a charge; a refund, a capture or a cancel with
	// its charge), oldest first, leaving out those driven under a live
	// lease unless p.IncludeLeased. A cursor that names no charge, refund
	// or operation is an EINVALID error naming "after".
	ChargesListStuck(ctx context.Context, p StuckListParams) (StuckPage, error)
	// ChargeInspect returns any merchant's charge by id, with its record;
	// ENOTFOUND when there is none.
	ChargeInspect(ctx context.Context, id string) (ChargeInspection, error)
	// OperationInspect returns any merchant's capture or cancel by id
	// (cp_… or vd_…), with its charge and its record; ENOTFOUND when there
	// is none.
	OperationInspect(ctx context.Context, id string) (OperationInspection, error)
	// ChargeOperations returns the capture or cancel that holds any
	// merchant's charge: pending or succeeded, at most one (the database
	// admits no second). Failed ones, which left the charge authorized,
	// are not listed.
	ChargeOperations(ctx context.Context, chargeID string) ([]Operation, error)
	// ChargeHistory returns the appended history of a charge, oldest first
	// (empty for a charge that took the common path); given a refund's or
	// an operation's id, that object's.
	ChargeHistory(ctx context.Context, chargeID string) ([]HistoryEntry, error)
	// HistoryAppend appends entries (ID and At are the store's), in one
	// statement.
	HistoryAppender
	// ChargeResolveClaim gives the processing record of a charge, or of a
	// refund or an operation (chargeID then names the refund, re_…, or
	// the capture or cancel, cp_… or vd_…), newToken
	// and a lease of lease, when nobody drives it: its lease ended, or its
	// owner let go of it and the rest is a back-off (KeyRecord.LeaseHeld).
	// An attempt or recovery pass in flight keeps it: ELEASED, with the
	// time its lease has left as RetryAfter. ENOTFOUND when there is no
	// such charge; ENOTPROCESSING when it is not processing.
	ChargeResolveClaim(ctx context.Context, chargeID, newToken string, lease time.Duration) (KeyRecord, error)
	// ChargeResolve completes the record through the same completion as
	// KeyComplete (a refund's when p.Complete.Kind is KindRefund, an
	// operation's when it is KindCapture or KindCancel) and appends
	// p.Audit, atomically, and returns the audit
	// entry as stored (its ID and At); ESTALE (and nothing written) when
	// p.Complete.Token no longer owns a processing record.
	ChargeResolve(ctx context.Context, p ResolveParams) (HistoryEntry, error)
	// AuditList returns resolutions and refused resolutions (the audit
	// trail), newest first.
	AuditList(ctx context.Context, p AuditListParams) ([]HistoryEntry, error)
}

// Check reports the first thing wrong with p as an EINVALID error.
func (p *StuckListParams) Check() error {
	if p.Limit < 1 || p.Limit > StuckListMaxLimit {
		return FieldError("limit", "limit must be between 1 and %d; got %d", StuckListMaxLimit, p.Limit)
	}
	if p.OlderThan < 0 {
		return FieldError("older_than", "older_than must not be negative")
	}
	if !ValidText(p.MerchantID) || !ValidText(p.After) {
		return FieldError("merchant", "merchant and after must be valid UTF-8 without U+0000")
	}
	return nil
}

// Check reports what is wrong with p.
func (p *AuditListParams) Check() error {
	if p.Limit < 1 || p.Limit > StuckListMaxLimit {
		return FieldError("limit", "limit must be between 1 and %d; got %d", StuckListMaxLimit, p.Limit)
	}
	return nil
}

// CheckText refuses an entry with text no store can keep.
func (e *HistoryEntry) CheckText() error {
	for _, s := range []string{e.ChargeID, e.MerchantID, string(e.Kind), e.Actor, e.Outcome, e.Detail, e.Reason} {
		if !ValidText(s) {
			return FieldError("history", "history entries must be valid UTF-8 without U+0000")
		}
	}
	return nil
}
