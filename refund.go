package chargeonce

import (
	"context"
	"time"
	"unicode/utf8"
)

// RefundStatus is the state of a refund; the names are Stripe's.
type RefundStatus string

// A refund is pending from its insert until the acquirer answers, then
// succeeded or failed. Canceled is a refund the acquirer dropped before it
// moved money (Stripe's canceled); like failed, it gives its amount back to
// what may still be refunded.
const (
	RefundPending   RefundStatus = "pending"
	RefundSucceeded RefundStatus = "succeeded"
	RefundFailed    RefundStatus = "failed"
	RefundCanceled  RefundStatus = "canceled"
)

// RefundStatuses are the states a refund can be in.
var RefundStatuses = []RefundStatus{RefundPending, RefundSucceeded, RefundFailed, RefundCanceled}

// Final reports whether s is a settled state.
func (s RefundStatus) Final() bool { return s != RefundPending && s != "" }

// GivesBack reports whether a refund settling in s gives its amount back to
// what its charge may still refund: no money went back.
func (s RefundStatus) GivesBack() bool { return s == RefundFailed || s == RefundCanceled }

// Refund moves money back from a captured charge. Its ID doubles as the
// reference sent to the acquirer, so re-driving it can never refund twice.
type Refund struct {
	ID             string
	MerchantID     string
	IdempotencyKey string
	ChargeID       string
	AmountCents    int64
	Currency       string
	Reason         string
	// Metadata is the client's own key-value pairs; nil when it has none.
	Metadata map[string]string
	Status   RefundStatus
	// FailureReason says why a failed or canceled refund did not move
	// money, as the acquirer put it.
	FailureReason string
	CreatedAt     time.Time
}

// Reference is the identifier the acquirer deduplicates the refund on.
func (r *Refund) Reference() string { return r.ID }

// RefundRequest is the decoded body of POST /v1/charges/{id}/refunds, after
// defaults. AmountCents zero means "what remains to be refunded", decided by
// the store when the refund is inserted: the request (and so its
// fingerprint) is the same whatever other refunds did meanwhile.
type RefundRequest struct {
	AmountCents int64             `json:"amount_cents,omitempty"`
	Reason      string            `json:"reason,omitempty"`
	Metadata    map[string]string `json:"metadata,omitempty"`
}

// MaxRefundReasonLen bounds a refund's reason, in characters.
const MaxRefundReasonLen = 500

// Normalize validates the request. Errors are EINVALID and name the field.
func (r *RefundRequest) Normalize() error {
	if r.AmountCents < 0 {
		return FieldError("amount_cents", "amount_cents must be a positive 64-bit integer, or left out to refund what remains")
	}
	if !ValidText(r.Reason) {
		return FieldError("reason", "reason must be valid UTF-8 without U+0000")
	}
	if n := utf8.RuneCountInString(r.Reason); n > MaxRefundReasonLen {
		return FieldError("reason", "reason must be at most %d characters; got %d", MaxRefundReasonLen, n)
	}
	c := ChargeRequest{Metadata: r.Metadata}
	if err := c.normalizeMetadata(); err != nil {
		return err
	}
	r.Metadata = c.Metadata
	return nil
}

// RecordKind says which money operation an idempotency record guards.
type RecordKind string

// The kinds of records. A charge's is the zero value, so every record
// written before refunds existed is a charge's.
const (
	KindCharge RecordKind = ""
	KindRefund RecordKind = "refund"
)

// Kind is the kind of operation the record guards.
func (r *KeyRecord) Kind() RecordKind {
	if r.Operation != nil {
		return r.Operation.Kind
	}
	if r.Refund != nil {
		return KindRefund
	}
	return KindCharge
}

// Reference is the acquirer reference of the operation the record guards.
func (r *KeyRecord) Reference() string {
	if r.Operation != nil {
		return r.Operation.Reference()
	}
	if r.Refund != nil {
		return r.Refund.Reference()
	}
	return r.Charge.Reference()
}

// ObjectID is the id of the object the record guards (ch_…, re_…, or a
// capture's cp_… or a cancel's vd_…).
func (r *KeyRecord) ObjectID() string {
	if r.Operation != nil {
		return r.Operation.ID
	}
	if r.Refund != nil {
		return r.Refund.ID
	}
	return r.Charge.ID
}

// RefundInsertParams describe a new refund: its idempotency record and its
// pending refund of a captured charge. Refund.AmountCents zero refunds what
// remains of the charge, as the store finds it under the charge's row lock.
type RefundInsertParams struct {
	Fingerprint string
	Token       string
	Lease       time.Duration
	// Refund carries ID, MerchantID, IdempotencyKey, ChargeID and the
	// request's fields; its Status and Currency are ignored (a new refund
	// is pending, in the charge's currency).
	Refund Refund
}

// CheckText refuses text no store can keep byte for byte (see
// KeyInsertParams.CheckText).
func (p *RefundInsertParams) CheckText() error {
	for _, f := range []struct{ name, value string }{
		{"merchant_id", p.Refund.MerchantID},
		{"idempotency_key", p.Refund.IdempotencyKey},
		{"charge_id", p.Refund.ChargeID},
		{"reason", p.Refund.Reason},
		{"id", p.Refund.ID},
		{"fingerprint", p.Fingerprint},
		{"token", p.Token},
	} {
		if !ValidText(f.value) {
			return FieldError(f.name, "%s must be valid UTF-8 without U+0000", f.name)
		}
	}
	for k, v := range p.Refund.Metadata {
		if !ValidText(k) || !ValidText(v) {
			return FieldError("metadata", "metadata must be valid UTF-8 without U+0000")
		}
	}
	if p.Refund.AmountCents < 0 {
		return FieldError("amount_cents", "amount_cents must be a positive 64-bit integer")
	}
	return nil
}

// Error codes of refunds.
const (
	// ENOTREFUNDABLE: the charge is not captured (processing, declined),
	// so nothing can be refunded; nothing was kept for the key.
	ENOTREFUNDABLE = "charge-not-refundable"
	// EREFUNDEXCEEDS: the refund asks for more than remains refundable on
	// the charge; nothing was kept for the key. The message names the
	// remaining amount.
	EREFUNDEXCEEDS = "refund-exceeds-captured"
)

// RefundExceeds is the EREFUNDEXCEEDS error for a refund of asked cents when
// remaining may still be refunded.
func RefundExceeds(chargeID string, asked, remaining int64, currency string) *Error {
	if asked == 0 {
		return &Error{Code: EREFUNDEXCEEDS, Field: "amount_cents", Message: "charge " + chargeID + " has nothing left to refund: remaining amount_cents is 0 " + currency}
	}
	return &Error{Code: EREFUNDEXCEEDS, Field: "amount_cents", Message: "amount_cents " + itoa(asked) +
		" exceeds what remains refundable on charge " + chargeID + ": remaining amount_cents is " + itoa(remaining) + " " + currency}
}

// NotRefundable is the ENOTREFUNDABLE error for a charge in status.
func NotRefundable(chargeID string, status Status) *Error {
	return Errorf(ENOTREFUNDABLE, "charge %s is %s; only a captured charge can be refunded", chargeID, status)
}

// RefundRefusal is the refund rule, one decision for both stores: why a
// refund of asked cents (zero: whatever remains) cannot be added to charge
// chargeID, in status, with remaining cents of currency still refundable.
// ENOTREFUNDABLE for a charge not captured, EREFUNDEXCEEDS when less than
// asked (or nothing at all) remains; nil when the refund may be added. The
// stores read the charge and keep the database's guards (the row lock, the
// CHECK on refunded_cents) for refunds racing each other.
func RefundRefusal(chargeID string, asked int64, status Status, remaining int64, currency string) error {
	switch {
	case status != StatusCaptured:
		return NotRefundable(chargeID, status)
	case remaining < max(asked, 1):
		return RefundExceeds(chargeID, asked, remaining, currency)
	}
	return nil
}

func itoa(n int64) string {
	var b [20]byte
	i := len(b)
	neg := n < 0
	if neg {
		n = -n
	}
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			break
		}
	}
	if neg {
		i--
		b[i] = '-'
	}
	return string(b[i:])
}

// Limits of a page of refunds, as for charges.
const (
	RefundsListDefaultLimit = 10
	RefundsListMaxLimit     = 100
)

// RefundsListParams select one page of a merchant's refunds, newest first
// (created_at, then id, both descending).
type RefundsListParams struct {
	MerchantID string
	// ChargeID, when not empty, keeps only that charge's refunds.
	ChargeID string
	Limit    int
	// StartingAfter, a refund id, asks for the refunds older than it.
	StartingAfter string
}

// Check reports the first thing wrong with p (EINVALID naming the
// parameter). Both stores call it.
func (p *RefundsListParams) Check() error {
	if p.Limit < 1 || p.Limit > RefundsListMaxLimit {
		return FieldError("limit", "limit must be between 1 and %d; got %d", RefundsListMaxLimit, p.Limit)
	}
	return nil
}

// RefundsPage is one page of refunds, newest first.
type RefundsPage struct {
	Refunds []Refund
	HasMore bool
}

// Refunds is the part of the store that keeps refunds. Their idempotency
// records are the charges' records (KeyRecord, with Refund set): KeyGet,
// KeyClaim, KeyLeaseSet, KeyAcquirerIDSet, KeyComplete (with Kind
// KindRefund), KeysClaimExpired, KeysDeleteExpired and KeysStuck take
// records of either kind, so refunds share the charges' leases, recovery
// and expiry from settlement.
type Refunds interface {
	// RefundInsert inserts the record and its pending refund atomically,
	// first, as KeyInsert does for a charge: of concurrent attempts with
	// one key exactly one gets inserted=true, the others the record that
	// won. In the same statement it adds the refund's amount to the
	// charge's refunded amount, under the charge's row lock, and the
	// database refuses the sum of refunds not failed exceeding the captured
	// amount: EREFUNDEXCEEDS naming what remains, with nothing written.
	// ENOTFOUND when the merchant has no such charge; ENOTREFUNDABLE when it
	// is not captured.
	RefundInsert(ctx context.Context, p RefundInsertParams) (rec KeyRecord, inserted bool, err error)
	// RefundGet returns the merchant's refund, or ENOTFOUND.
	RefundGet(ctx context.Context, merchantID, id string) (Refund, error)
	// RefundsList returns one page of the merchant's refunds, newest first.
	// A StartingAfter that is not one of the merchant's refunds is EINVALID.
	RefundsList(ctx context.Context, p RefundsListParams) (RefundsPage, error)
}

// RefundCall is what chargeonce sends the acquirer to refund.
type RefundCall struct {
	// Reference is the refund's own reference (its id), which the acquirer
	// deduplicates on.
	Reference string `json:"reference"`
	// ChargeReference is the refunded capture's reference.
	ChargeReference string `json:"charge_reference"`
	Merchant        string `json:"merchant"`
	AmountCents     int64  `json:"amount_cents"`
	Currency        string `json:"currency"`
}

// RefundResult is the acquirer's definite answer to a refund.
type RefundResult struct {
	Reference     string       `json:"reference"`
	Status        RefundStatus `json:"status"`
	FailureReason string       `json:"failure_reason,omitempty"`
}

// Refunder is an Acquirer that can move money back. Refund is idempotent by
// reference like Capture: a nil error is a definite answer (succeeded,
// failed or canceled; pending is not definite), ErrCaptureRejected a
// refusal that moved nothing, any other error an unknown outcome.
// RefundLookup asks what became of a refund's reference and answers as
// honestly as Lookup (LookupResult.Refund holds a found refund).
type Refunder interface {
	Refund(ctx context.Context, req RefundCall) (RefundResult, error)
	RefundLookup(ctx context.Context, req LookupRequest) (LookupResult, error)
}
