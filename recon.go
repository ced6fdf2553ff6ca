package chargeonce

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"time"
)

// Reconciliation (SPEC "Reconciliation (v4)") compares our charges with the
// acquirer's ledger, joined by reference. Both sides are read in reference
// order, a page at a time, so that package recon can merge-join them in
// bounded memory. These are the seams it reads through: ReconStore for our
// side, Ledger for the acquirer's.

// Limits of a reconciliation page, on either side.
const (
	ReconDefaultPage = 1000
	ReconMaxPage     = 1000
)

// ReconChargesParams select one page of the charges created in [From, To),
// in reference (charge id) order, after the reference After ("" for the
// first page).
//
// IDMin and IDMax, when not empty, also bound the ids: IDMin <= id < IDMax.
// Charge ids begin with their creation time (idempotency.NewChargeID), so a
// period's charges are one stretch of the primary key, and the bounds let a
// store read that stretch instead of walking the key from its start.
type ReconChargesParams struct {
	From, To     time.Time
	After        string
	IDMin, IDMax string
	Limit        int
}

// ReconRefundsParams select one page of the refunds created in [From, To),
// in (ChargeID, ID) order, after the cursor (AfterCharge, AfterID) ("" for
// the first page): the order of the acquirer's ledger, whose refunds sit
// under the reference of the charge they refund.
//
// ChargeMax, when not empty, bounds the charges: ChargeID < ChargeMax. A
// refund is made after its charge, so with time-ordered charge ids the
// period's end bounds the charges it can refund.
type ReconRefundsParams struct {
	From, To             time.Time
	AfterCharge, AfterID string
	ChargeMax            string
	Limit                int
}

// ReconOperationsParams select one page of the captures and cancels of
// authorizations (Operation), pending or succeeded, last changed in [From,
// To) — a settled one by when it settled, a pending one by when it was
// made — in charge id order, after the charge AfterCharge ("" for the first
// page). A charge has at most one such operation (the database keeps one
// pending or succeeded per charge), so the charge id alone is the cursor.
// One that failed moved nothing and is not listed.
//
// ChargeMax, when not empty, bounds the charges: ChargeID < ChargeMax, as
// for refunds. ChargeMin, when not empty, bounds them from below:
// ChargeMin <= ChargeID; with ChargeMax = ChargeMin+"\x01" a page is the
// one charge's operation (reconciliation looks ours up by the charge's
// reference when the acquirer shows a settlement ours is not read with).
type ReconOperationsParams struct {
	From, To    time.Time
	AfterCharge string
	ChargeMin   string
	ChargeMax   string
	Limit       int
}

// ReconOperation is a capture or cancel of an authorization as
// reconciliation reads it: the operation and when it settled (for a pending
// one, when it was made), the time that puts it in a period.
type ReconOperation struct {
	Operation
	SettledAt time.Time
}

// ReconRun is one stored reconciliation run, keyed by (Acquirer, Period):
// running the same period against the same acquirer again updates this run
// rather than adding another.
type ReconRun struct {
	// Acquirer names the acquirer reconciled ("sim", a URL's host, "stripe").
	Acquirer string
	// Period is the run's key within the acquirer: the day (2026-12-06) or
	// the range "FROM/TO" in RFC 3339.
	Period string
	From   time.Time
	To     time.Time
	// Counts are the mismatches found, by type.
	Counts map[string]int
	// Report is the run's report as JSON (recon.Report).
	Report []byte
	// Merchants are each merchant's share of the run, stored with it; the
	// first save of a merchant's share writes its reconciliation.completed
	// event.
	Merchants []ReconMerchantRun
	// Runs counts how often the period was reconciled: the latest report
	// replaced the earlier ones.
	Runs      int
	CreatedAt time.Time
	UpdatedAt time.Time
}

// EventReconciliationCompleted is the event a merchant receives when a
// reconciliation run of a period first counts its charges: its
// data.object is the merchant's share of the run (ReconMerchantRun), as
// the latest re-run left it.
const EventReconciliationCompleted = "reconciliation.completed"

// ReconMerchantRun is one merchant's share of a run: only its own charges,
// refunds and mismatches, never another merchant's.
type ReconMerchantRun struct {
	// ID is derived from (Acquirer, Period, MerchantID) (ReconMerchantRunID).
	ID         string
	Acquirer   string
	Period     string
	MerchantID string
	From, To   time.Time
	Charges    int
	Refunds    int
	// Operations are the merchant's captures and cancels of
	// authorizations read for the period.
	Operations int
	Matched    int
	// Counts are the merchant's mismatches by type, every type present.
	Counts    map[string]int
	Runs      int
	CreatedAt time.Time
	UpdatedAt time.Time
}

// ReconMerchantRunID names a merchant's share of the run of (acquirer,
// period): "rcn_" and 24 hex digits of a hash of the three, the same for
// every re-run, so the share's event is written once.
func ReconMerchantRunID(acquirer, period, merchant string) string {
	h := sha256.Sum256([]byte(acquirer + "\x00" + period + "\x00" + merchant))
	return "rcn_" + hex.EncodeToString(h[:12])
}

// ReconAck is an operator's acknowledgement of one exception of a run: the
// audit entry of who looked at it, when, and what they found.
type ReconAck struct {
	Acquirer, Period string
	// Type, Reference and ObjectReference name the exception (a
	// recon.Mismatch's type, reference and object_reference).
	Type, Reference, ObjectReference string
	Actor                            string
	Note                             string
	At                               time.Time
}

// MaxReconAckNote bounds an acknowledgement's note, in characters.
const MaxReconAckNote = 1000

// ReconOps is the operators' side of reconciliation: the runs to look at,
// and acknowledgements of their exceptions.
type ReconOps interface {
	// ReconRunsList returns the latest limit runs, most recently run
	// first, without their reports.
	ReconRunsList(ctx context.Context, limit int) ([]ReconRun, error)
	// ReconAckInsert records a and returns it as stored; an exception
	// acknowledged before keeps its first acknowledgement, which is
	// returned instead (the trail is append-only).
	ReconAckInsert(ctx context.Context, a ReconAck) (ReconAck, error)
	// ReconAcksList returns the acknowledgements of the run of (acquirer,
	// period).
	ReconAcksList(ctx context.Context, acquirer, period string) ([]ReconAck, error)
}

// ReconStore is what reconciliation reads from (and writes its runs to) in
// a store. Both stores implement it and pass storetest.RunRecon. It is
// kept apart from Store: nothing on the charge path needs it.
type ReconStore interface {
	// ChargesListByReference returns up to p.Limit charges created in
	// [p.From, p.To) whose id (the acquirer reference) sorts after
	// p.After, in id order (byte order, as Go compares strings). Fewer
	// than p.Limit means the range is exhausted.
	ChargesListByReference(ctx context.Context, p ReconChargesParams) ([]Charge, error)
	// RefundsListByChargeReference returns up to p.Limit refunds created
	// in [p.From, p.To) whose (charge id, id) sorts after (p.AfterCharge,
	// p.AfterID), in that order (byte order). Fewer than p.Limit means the
	// range is exhausted.
	RefundsListByChargeReference(ctx context.Context, p ReconRefundsParams) ([]Refund, error)
	// OperationsListByChargeReference returns up to p.Limit captures and
	// cancels of authorizations, pending or succeeded, last changed in
	// [p.From, p.To), whose charge id sorts after p.AfterCharge, in charge
	// id order (byte order). Fewer than p.Limit means the range is
	// exhausted.
	OperationsListByChargeReference(ctx context.Context, p ReconOperationsParams) ([]ReconOperation, error)
	// ReconRunSave stores run under (run.Acquirer, run.Period): inserted
	// with Runs = 1 the first time, replacing the report and counting one
	// more run after that. It returns the run as stored. In the same
	// transaction it stores each of run.Merchants the same way, and writes
	// a reconciliation.completed event for each merchant whose share is new
	// (its object is the share, its id derived from the share's): an event
	// per (acquirer, period, merchant), however often the period is run.
	ReconRunSave(ctx context.Context, run ReconRun) (ReconRun, error)
	// ReconRunGet returns the stored run, or ENOTFOUND.
	ReconRunGet(ctx context.Context, acquirer, period string) (ReconRun, error)
	// ReconMerchantRunGet returns the merchant's share with id (the object
	// of its reconciliation.completed event); another merchant's is
	// ENOTFOUND.
	ReconMerchantRunGet(ctx context.Context, merchantID, id string) (ReconMerchantRun, error)
}

// LedgerKind is what a ledger entry did with money.
type LedgerKind string

// The kinds of ledger entries. Every entry is filed under the reference of
// the charge it belongs to (ChargeReference): a capture (automatic,
// captured or declined) and an authorization (a charge with manual capture,
// held and not taken) under their own; a refund, a capture of an
// authorization (LedgerManualCapture, for the amount captured) and a void
// under the charge's, with the reference they were made under when the
// acquirer keeps it (the simulator does; Stripe captures and cancels the
// PaymentIntent itself, so its entries carry none).
const (
	LedgerCapture       LedgerKind = "capture"
	LedgerAuthorization LedgerKind = "authorization"
	LedgerManualCapture LedgerKind = "manual_capture"
	LedgerRefund        LedgerKind = "refund"
	LedgerVoid          LedgerKind = "void"
)

// LedgerEntry is one object in an acquirer's ledger: a capture attempt
// that settled (captured or declined), a refund, a void.
type LedgerEntry struct {
	// ID is the acquirer's own id of the entry; two captures under one
	// reference (after its idempotency window) have two ids.
	ID   string     `json:"id"`
	Kind LedgerKind `json:"kind"`
	// Reference is the reference the entry was created under: the charge
	// id for a capture or an authorization, the refund's own reference for
	// a refund, the operation's (cp_…, vd_…) for a capture of an
	// authorization or a void, "" when the acquirer does not keep it.
	Reference string `json:"reference"`
	// ChargeReference is the reference of the charge the entry belongs
	// to, the join key: Reference itself for a capture or an
	// authorization, the refunded capture's or the settled authorization's
	// reference otherwise. Ledgers are ordered by it.
	ChargeReference string `json:"charge_reference"`
	Merchant        string `json:"merchant"`
	OrderID         int64  `json:"order_id"`
	AmountCents     int64  `json:"amount_cents"`
	Currency        string `json:"currency"`
	// Status is captured or declined for a capture; authorized for an
	// authorization; succeeded, pending or failed for a refund; succeeded
	// for a capture of an authorization and for a void.
	Status    string    `json:"status"`
	CreatedAt time.Time `json:"created_at"`
	// Metadata is what the acquirer keeps beside the entry that we sent:
	// LedgerMetaReference names our id, the join's fallback when the
	// entry's own reference is missing or unknown.
	Metadata map[string]string `json:"metadata,omitempty"`
}

// LedgerMetaReference is the metadata key under which an acquirer's object
// carries our id (a charge's, or a refund's): the Stripe adapter writes it
// on every PaymentIntent it creates.
const LedgerMetaReference = "chargeonce_reference"

// MetaReference is our id as the entry's metadata carries it, "" when it
// carries none.
func (e *LedgerEntry) MetaReference() string { return e.Metadata[LedgerMetaReference] }

// LedgerParams select one page of an acquirer's ledger: the entries
// created in [From, To), ordered by (ChargeReference, then the order the
// acquirer created them), after the cursor After ("" for the first page).
type LedgerParams struct {
	From, To time.Time
	After    string
	Limit    int
}

// LedgerPage is one page of a ledger. Next is the cursor of the following
// page, "" when this page is the last.
type LedgerPage struct {
	Entries []LedgerEntry `json:"data"`
	Next    string        `json:"next"`
}

// Ledger is an acquirer's list of what it did with money, for
// reconciliation. The simulator (in-process and over HTTP) implements it.
type Ledger interface {
	LedgerList(ctx context.Context, p LedgerParams) (LedgerPage, error)
}
