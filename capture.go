package chargeonce

import (
	"context"
	"time"
)

// CaptureMethod says when a charge's money is taken.
type CaptureMethod string

// The capture methods. Automatic, the default, captures when the charge is
// created; a charge with CaptureManual is only authorized (the acquirer
// holds the amount on the card), and a capture (POST
// /v1/charges/{id}/capture) or a cancel (POST /v1/charges/{id}/cancel)
// settles it later. An automatic charge stores and answers no capture
// method at all, so its record, fingerprint and answer bytes are those of
// a charge made before manual capture existed.
const (
	CaptureAutomatic CaptureMethod = "automatic"
	CaptureManual    CaptureMethod = "manual"
)

// DefaultAuthorizationTTL is how long an authorization may wait for its
// capture before the sweeper cancels it (the serve flag
// --authorization-ttl), like a card network's hold.
const DefaultAuthorizationTTL = 7 * 24 * time.Hour

// AmountCaptured is what the charge took: AmountCents for a captured
// automatic charge, CapturedCents for a captured manual one, and zero for
// a charge not captured.
func (c *Charge) AmountCaptured() int64 {
	if c.Status != StatusCaptured {
		return 0
	}
	if c.CaptureMethod == CaptureManual {
		return c.CapturedCents
	}
	return c.AmountCents
}

// The kinds of records of an authorization's settlement.
const (
	KindCapture RecordKind = "capture"
	KindCancel  RecordKind = "cancel"
)

// OperationStatus is the state of a capture or a cancel of an
// authorization.
type OperationStatus string

// A capture or cancel is pending from its insert until the acquirer
// answers; it succeeded when the authorization was captured (or voided),
// and failed when the acquirer refused it, which leaves the charge
// authorized and free for another capture or cancel.
const (
	OperationPending   OperationStatus = "pending"
	OperationSucceeded OperationStatus = "succeeded"
	OperationFailed    OperationStatus = "failed"
)

// Final reports whether s is a settled state.
func (s OperationStatus) Final() bool { return s == OperationSucceeded || s == OperationFailed }

// Operation is a capture or a cancel (void) of an authorized charge. Its ID
// (cp_… or vd_…) doubles as the reference sent to the acquirer, so
// re-driving it can never capture or void twice.
type Operation struct {
	ID             string
	Kind           RecordKind
	MerchantID     string
	IdempotencyKey string
	ChargeID       string
	// AmountCents is the amount captured, or for a cancel the authorized
	// amount released.
	AmountCents   int64
	Currency      string
	Status        OperationStatus
	FailureReason string
	CreatedAt     time.Time
}

// Reference is the identifier the acquirer deduplicates the operation on.
func (o *Operation) Reference() string { return o.ID }

// CaptureBody is the decoded body of POST /v1/charges/{id}/capture.
// AmountCents zero captures the whole authorized amount.
type CaptureBody struct {
	AmountCents int64 `json:"amount_cents,omitempty"`
}

// Normalize validates the request. Errors are EINVALID and name the field.
func (r *CaptureBody) Normalize() error {
	if r.AmountCents < 0 {
		return FieldError("amount_cents", "amount_cents must be a positive 64-bit integer, or left out to capture the whole authorized amount")
	}
	return nil
}

// OperationInsertParams describe a new capture or cancel: its idempotency
// record and its pending operation of an authorized charge.
type OperationInsertParams struct {
	Fingerprint string
	Token       string
	Lease       time.Duration
	// Operation carries ID, Kind, MerchantID, IdempotencyKey, ChargeID
	// and, for a capture, AmountCents (zero: the whole authorized amount;
	// a cancel always releases the whole of it). Its Status and Currency
	// are ignored.
	Operation Operation
}

// CheckText refuses text no store can keep byte for byte.
func (p *OperationInsertParams) CheckText() error {
	for _, f := range []struct{ name, value string }{
		{"merchant_id", p.Operation.MerchantID},
		{"idempotency_key", p.Operation.IdempotencyKey},
		{"charge_id", p.Operation.ChargeID},
		{"id", p.Operation.ID},
		{"fingerprint", p.Fingerprint},
		{"token", p.Token},
	} {
		if !ValidText(f.value) {
			return FieldError(f.name, "%s must be valid UTF-8 without U+0000", f.name)
		}
	}
	if p.Operation.Kind != KindCapture && p.Operation.Kind != KindCancel {
		return Errorf(EINVALID, "an operation is a capture or a cancel, not %q", p.Operation.Kind)
	}
	if p.Operation.AmountCents < 0 {
		return FieldError("amount_cents", "amount_cents must be a positive 64-bit integer")
	}
	return nil
}

// Error codes of captures and cancels.
const (
	// ENOTAUTHORIZED: the charge is not an authorization waiting for its
	// capture (it is processing, declined, captured, canceled, or was
	// captured automatically), or another capture or cancel of it is
	// pending; nothing was kept for the key.
	ENOTAUTHORIZED = "charge-not-authorized"
	// ECAPTUREEXCEEDS: the capture asks for more than was authorized;
	// nothing was kept for the key.
	ECAPTUREEXCEEDS = "capture-exceeds-authorized"
	// EOPERATIONFAILED: the acquirer refused the capture or cancel; the
	// charge is still authorized. It is a stored answer (402), replayed.
	EOPERATIONFAILED = "operation-failed"
)

// NotAuthorized is the ENOTAUTHORIZED error for an operation of kind on a
// charge in status (pending names an operation of it in flight).
func NotAuthorized(chargeID string, kind RecordKind, status Status, pending RecordKind) *Error {
	verb := "captured"
	if kind == KindCancel {
		verb = "canceled"
	}
	if pending != "" {
		return Errorf(ENOTAUTHORIZED, "charge %s already has a %s in progress or done; it cannot be %s", chargeID, pending, verb)
	}
	return Errorf(ENOTAUTHORIZED, "charge %s is %s; only an authorized charge (capture_method manual) can be %s", chargeID, status, verb)
}

// CaptureExceeds is the ECAPTUREEXCEEDS error for a capture of asked cents
// of an authorization of authorized cents.
func CaptureExceeds(chargeID string, asked, authorized int64, currency string) *Error {
	return &Error{Code: ECAPTUREEXCEEDS, Field: "amount_cents", Message: "amount_cents " + itoa(asked) +
		" exceeds what charge " + chargeID + " authorized: " + itoa(authorized) + " " + currency}
}

// OperationRefusal is the capture and cancel rule, one decision for both
// stores: why an operation of kind asking for asked cents (zero: the whole
// authorization) cannot be inserted for charge chargeID, in status, having
// authorized cents of currency, while live names the kind of another
// operation of it pending or succeeded ("" when none). ENOTAUTHORIZED for a
// charge held by another operation or not authorized, ECAPTUREEXCEEDS for a
// capture past the authorization; nil when it may be inserted. The partial
// unique index charge_operations_one_live still decides between operations
// racing each other.
func OperationRefusal(chargeID string, kind RecordKind, asked int64, status Status, authorized int64, currency string, live RecordKind) error {
	switch {
	case live != "":
		return NotAuthorized(chargeID, kind, status, live)
	case status != StatusAuthorized:
		return NotAuthorized(chargeID, kind, status, "")
	case asked > authorized:
		return CaptureExceeds(chargeID, asked, authorized, currency)
	}
	return nil
}

// ExpiredAuthorization is an authorization past its time to live, for the
// sweeper to cancel. CreatedAt and ChargeID place it in the list
// (AuthorizationsExpiredParams.After).
type ExpiredAuthorization struct {
	MerchantID string
	ChargeID   string
	CreatedAt  time.Time
}

// ExpiryKeyPrefix prefixes the Idempotency-Key under which the sweeper
// cancels an expired authorization: one key per charge, so that a sweep
// repeated (by another instance, or after a crash) finds the cancel it
// already began instead of beginning another, and so that the list of
// expired authorizations can leave out one whose void the acquirer
// refused (the cancel under this key failed): that one is an operator's.
const ExpiryKeyPrefix = "chargeonce-authorization-expired-"

// ExpiryOutcome is what became of one attempt of the sweeper to cancel an
// expired authorization.
type ExpiryOutcome string

// The outcomes of CancelExpired.
const (
	// ExpiryCanceled: this attempt voided the authorization.
	ExpiryCanceled ExpiryOutcome = "canceled"
	// ExpiryPending: the void's outcome is unknown; recovery settles it.
	ExpiryPending ExpiryOutcome = "pending"
	// ExpiryFailed: the acquirer refused the void (it captured the
	// authorization, say). The charge stays authorized: an operator's
	// item, which the sweeper does not try again.
	ExpiryFailed ExpiryOutcome = "failed"
	// ExpiryAnswered: the cancel under the sweeper's key had already been
	// answered (by another sweep): this attempt did nothing.
	ExpiryAnswered ExpiryOutcome = "answered"
)

// AuthorizationsExpiredParams select a page of expired authorizations.
type AuthorizationsExpiredParams struct {
	// TTL is the authorizations' time to live (--authorization-ttl).
	TTL time.Duration
	// Limit bounds the page; zero or less lists nothing.
	Limit int
	// After, when set, is the last authorization of the previous page:
	// the page starts after its (CreatedAt, ChargeID), so that a sweep
	// goes through the list once, whatever became of what it tried.
	After *ExpiredAuthorization
}

// Operations is the part of the store that keeps captures and cancels of
// authorizations. Their idempotency records are rows of the charges'
// records (KeyRecord with Operation set): KeyGet, KeyClaim, KeyLeaseSet,
// KeyAcquirerIDSet, KeyComplete (with Kind KindCapture or KindCancel and
// OperationStatus), KeysClaimExpired, KeysDeleteExpired and KeysStuck take
// them, so they share the charges' leases, recovery and expiry.
type Operations interface {
	// OperationInsert inserts the record and its pending operation
	// atomically, first, as KeyInsert does for a charge: of concurrent
	// attempts with one key exactly one gets inserted=true, the others the
	// record that won. The database decides between operations of one
	// charge: at most one capture or cancel of a charge is pending or
	// succeeded, whatever the concurrency. ENOTFOUND when the merchant has
	// no such charge; ENOTAUTHORIZED when it is not authorized or another
	// operation holds it; ECAPTUREEXCEEDS past the authorized amount; in
	// each case nothing is written.
	OperationInsert(ctx context.Context, p OperationInsertParams) (rec KeyRecord, inserted bool, err error)
	// AuthorizationsExpired returns up to p.Limit authorized charges
	// created more than p.TTL ago (by the database's clock), after
	// p.After, in (created_at, id) order, with no capture or cancel
	// pending or succeeded and none whose sweeper's cancel (the key
	// ExpiryKeyPrefix + its id) failed: an authorization the acquirer
	// refused to void is tried once, never again by the sweeper.
	AuthorizationsExpired(ctx context.Context, p AuthorizationsExpiredParams) ([]ExpiredAuthorization, error)
}

// OperationCall is what chargeonce sends the acquirer to capture or void an
// authorization.
type OperationCall struct {
	// Reference is the operation's own reference (its id), which the
	// acquirer deduplicates on.
	Reference string `json:"reference"`
	// ChargeReference is the authorization's reference (the charge's id).
	ChargeReference string `json:"charge_reference"`
	Merchant        string `json:"merchant"`
	AmountCents     int64  `json:"amount_cents"`
	Currency        string `json:"currency"`
}

// OperationResult is the acquirer's definite answer to a capture or a void.
type OperationResult struct {
	Reference     string          `json:"reference"`
	Status        OperationStatus `json:"status"`
	FailureReason string          `json:"failure_reason,omitempty"`
}

// ManualCapturer is an Acquirer that can authorize without capturing and
// settle the authorization later. Authorize is Capture's twin (idempotent
// by the charge's reference, the same errors) whose success is
// StatusAuthorized; Lookup of the charge's reference finds the
// authorization (LookupResult.Result with StatusAuthorized, or
// StatusCaptured/StatusCanceled once settled: an authorization is found
// whatever became of it). CaptureAuthorized and Void are idempotent by the
// operation's own reference: a nil error is a definite answer (succeeded or
// failed), ErrCaptureRejected a refusal that moved nothing, any other error
// an unknown outcome. OperationLookup asks what became of an operation's
// reference and answers as honestly as Lookup (LookupResult.Operation holds
// a found one).
type ManualCapturer interface {
	Authorize(ctx context.Context, req CaptureRequest) (CaptureResult, error)
	CaptureAuthorized(ctx context.Context, req OperationCall) (OperationResult, error)
	Void(ctx context.Context, req OperationCall) (OperationResult, error)
	OperationLookup(ctx context.Context, req LookupRequest) (LookupResult, error)
}
