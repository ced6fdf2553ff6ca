package chargeonce

import (
	"context"
	"errors"
	"slices"
	"time"
)

// KeyState is the state of an idempotency record.
type KeyState string

// An idempotency record is processing from its insert until a final response
// is stored; completed records replay that response until they expire.
const (
	KeyProcessing KeyState = "processing"
	KeyCompleted  KeyState = "completed"
)

// KeyRecord is an idempotency record together with the charge it guards.
type KeyRecord struct {
	MerchantID  string
	Key         string
	Fingerprint string
	// Token identifies the attempt that currently owns the record. Completing
	// the record is a compare-and-set on it.
	Token string
	State KeyState
	// LeaseUntil is when the owning attempt's lease ends.
	LeaseUntil time.Time
	// LeaseExpired is LeaseUntil <= now(), decided by the database's clock
	// when the record was read, never by an instance's clock.
	LeaseExpired bool
	// LeaseRemaining is LeaseUntil - now() when positive, else zero, by the
	// database's clock when the record was read: how long until the lease
	// (or recovery's back-off) ends. Retry-After is computed from it.
	LeaseRemaining time.Duration
	// LeaseHeld tells whether an attempt, recovery or a resolution is
	// driving the record under its lease. It is false once the owner let go
	// (KeyLeaseSet): a lease still running then is only a back-off, and an
	// operator may take the record (ChargeResolveClaim).
	LeaseHeld bool
	// RecoveryAttempts counts how often recovery re-drove the acquirer for
	// this record without reaching a final answer.
	RecoveryAttempts int
	// AcquirerID is the acquirer's own id for the charge's reference (a
	// Stripe PaymentIntent id) when an unsettled answer named one
	// (KeyAcquirerIDSet), so that lookups retrieve it instead of searching.
	AcquirerID string
	// Age is now() - the charge's creation, by the database's clock when
	// the record was read: how long ago the reference was first sent, at
	// most. Adapters compare it with their acquirer's windows, never an
	// instance's clock with a database timestamp.
	Age            time.Duration
	ResponseStatus int
	ResponseBody   []byte
	CreatedAt      time.Time
	// ExpiresAt is when a completed record expires: KeyCompleteParams.TTL
	// after it became final. It is zero while the record is processing: a
	// record still owed an answer never expires.
	ExpiresAt time.Time
	// ExpiresIn is the time the record had left before ExpiresAt when it
	// was read, computed by the database's clock (zero once expired, and
	// while processing). Caches count it down on their own monotonic clock
	// instead of comparing ExpiresAt with an instance's wall clock.
	ExpiresIn time.Duration
	// Quiet is how long nothing had been sent for the record's reference
	// when an operator's resolution claimed it (ChargeResolveClaim, the
	// only read that fills it): now() - the LeaseUntil of the lease or
	// back-off it took over, by the database's clock. Every request for a
	// reference is sent under a lease, before it ends, so our last
	// request is at least Quiet old (SPEC "Finality"). It is negative
	// while a back-off had time left.
	Quiet time.Duration
	// Charge is the charge the record guards or, for a refund's record
	// (Refund set), the charge being refunded.
	Charge Charge
	// Refund is the refund the record guards; nil for a charge's record.
	Refund *Refund
	// Operation is the capture or cancel the record guards (Charge is then
	// the authorized charge); nil for other records.
	Operation *Operation
}

// KeyInsertParams describe a new intent: its record and its processing charge.
// A new record has no expiry: it expires only once completed (see
// KeyCompleteParams.TTL).
type KeyInsertParams struct {
	Fingerprint string
	Token       string
	Lease       time.Duration
	// Charge carries ID, MerchantID, IdempotencyKey and the request fields.
	// Its Status is ignored: a new charge is always processing.
	Charge Charge
}

// KeyCompleteParams describe the final answer stored for an intent.
type KeyCompleteParams struct {
	MerchantID     string
	Key            string
	Token          string
	ChargeStatus   Status
	DeclineCode    string
	ResponseStatus int
	ResponseBody   []byte
	// Kind is the kind of record completed: KindRefund settles its refund
	// as RefundStatus (giving a failed or canceled refund's amount back to
	// the charge's refundable amount in the same statement) and leaves
	// ChargeStatus unused.
	Kind          RecordKind
	RefundStatus  RefundStatus
	FailureReason string
	// OperationStatus is the final status of a capture's or a cancel's
	// record (Kind KindCapture or KindCancel): succeeded settles the
	// charge captured (CapturedCents the operation's amount) or canceled,
	// in the same statement; failed leaves it authorized.
	OperationStatus OperationStatus
	// TTL is how long the completed record is kept and replayed, counted
	// from this completion by the database's clock: a charge settled late
	// (by recovery, after a long acquirer outage) is still replayed for the
	// whole TTL to the retries that come to learn its outcome.
	TTL time.Duration
}

// StuckStats describe processing records whose lease has ended: orphans that
// recovery has not yet settled. OldestAge is measured from the oldest such
// record's creation, so recovery's back-off does not reset it.
type StuckStats struct {
	Count     int
	OldestAge time.Duration
}

// Limits of a page of charges (SPEC "GET /v1/charges").
const (
	ChargesListDefaultLimit = 10
	ChargesListMaxLimit     = 100
)

// Statuses are the states a charge can be in, in the order lists query them.
var Statuses = []Status{StatusProcessing, StatusAuthorized, StatusCaptured, StatusDeclined, StatusCanceled}

// ChargesListParams select one page of a merchant's charges. Charges are
// ordered newest first, by created_at and then by id (both descending), so
// the order is total and a cursor names one place in it.
type ChargesListParams struct {
	MerchantID string
	// OrderID, when not zero, keeps only the charges of that order.
	OrderID int64
	// Status, when not empty, keeps only the charges in that state.
	Status Status
	// Limit is the most charges the page holds, 1 to ChargesListMaxLimit.
	Limit int
	// StartingAfter, a charge id, asks for the page of charges older than
	// that charge: the next page, when it is the last charge of a page.
	StartingAfter string
	// EndingBefore, a charge id, asks for the page of charges newer than
	// that charge (the previous page), still listed newest first. At most
	// one of StartingAfter and EndingBefore is set.
	EndingBefore string
}

// ChargesPage is one page of charges, newest first.
type ChargesPage struct {
	Charges []Charge
	// HasMore tells whether more charges lie beyond the page in the
	// direction of travel: older ones, or newer ones with EndingBefore.
	HasMore bool
}

// Store is the persistence seam. It has two implementations, postgres.Store
// and sqlite.Store, which pass one conformance suite (storetest).
//
// Every method that changes a record commits before it returns: the engine
// relies on the record being durable before it calls the acquirer.
type Store interface {
	// KeyInsert inserts the record and its processing charge atomically with
	// INSERT ... ON CONFLICT DO NOTHING on UNIQUE (merchant_id, key). When the
	// key is taken by a live record it returns that record and inserted=false.
	// A completed record past its expiry is removed first (its charge is
	// kept): a key reused after expiry is a new intent. A processing record
	// has no expiry and is never removed: it is a charge recovery has not
	// settled yet.
	KeyInsert(ctx context.Context, p KeyInsertParams) (rec KeyRecord, inserted bool, err error)
	// KeyGet returns the record, or an ENOTFOUND error.
	KeyGet(ctx context.Context, merchantID, key string) (KeyRecord, error)
	// KeyComplete stores the final response and the charge's final status,
	// and sets the record to expire p.TTL from now (the database's clock),
	// if and only if the record is still processing and owned by p.Token;
	// otherwise it returns an ESTALE error and changes nothing.
	KeyComplete(ctx context.Context, p KeyCompleteParams) error
	// KeyRelease deletes a processing record and its charge when owned by
	// token (the acquirer was never called), so a retry starts afresh.
	// ESTALE when token no longer owns it. A record flagged by KeyNotify is
	// not deleted but kept processing with its lease ended: a queue message
	// was acked on the promise that its answer reaches the outbox, and a
	// fresh record inserted by a retry would not carry that promise.
	// Recovery or the retry drives it (looking the reference up first), and
	// its completion writes the outbox row.
	KeyRelease(ctx context.Context, merchantID, key, token string) error
	// KeyLeaseSet moves the end of token's lease to now()+d (d may be zero:
	// the outcome is unknown and recovery may take over at once) and, when
	// recoveryAttempt is true, counts one more recovery attempt. The owner
	// lets go of the record: the rest of the lease is a back-off, during
	// which nobody drives it (KeyRecord.LeaseHeld is false).
	// ESTALE when token no longer owns a processing record.
	KeyLeaseSet(ctx context.Context, merchantID, key, token string, d time.Duration, recoveryAttempt bool) error
	// KeyAcquirerIDSet records the acquirer's own id for the charge's
	// reference (KeyRecord.AcquirerID) while token owns the processing
	// record; ESTALE otherwise.
	KeyAcquirerIDSet(ctx context.Context, merchantID, key, token, acquirerID string) error
	// KeyClaim takes over one processing record whose lease has ended, giving
	// it newToken and a lease of lease. claimed=false when the record is not
	// processing or its lease is still running, and rec is then the record
	// as it is; ENOTFOUND when there is no record.
	KeyClaim(ctx context.Context, merchantID, key, newToken string, lease time.Duration) (rec KeyRecord, claimed bool, err error)
	// KeysClaimExpired claims up to limit processing records whose lease has
	// ended, giving each a fresh token and a lease of lease. Two concurrent
	// callers never claim the same record.
	KeysClaimExpired(ctx context.Context, lease time.Duration, limit int) ([]KeyRecord, error)
	// KeysDeleteExpired deletes up to limit completed records past their
	// expiry and returns how many it deleted. Charges are never deleted, and
	// neither are processing records (recovery still owes them an answer).
	KeysDeleteExpired(ctx context.Context, limit int) (int, error)
	// KeysStuck reports processing records whose lease has ended, and those
	// recovery has tried and failed to settle (backed off, their lease lies
	// in the future, but they are stuck all the same).
	KeysStuck(ctx context.Context) (StuckStats, error)

	// ChargeGet returns the merchant's charge, or ENOTFOUND (also for another
	// merchant's charge).
	ChargeGet(ctx context.Context, merchantID, id string) (Charge, error)
	// ChargesListByOrder returns the merchant's charges for an order, newest
	// first, all of them: it serves checks for double charges (tests,
	// operators), never the API, which pages with ChargesList.
	ChargesListByOrder(ctx context.Context, merchantID string, orderID int64) ([]Charge, error)
	// ChargesList returns one page of the merchant's charges, newest first,
	// and whether more lie beyond it (see ChargesListParams). It reads at
	// most a few pages' worth of index entries whatever the merchant has
	// stored: every query is a keyset range on an index, per status, with a
	// LIMIT. A cursor that is not one of the merchant's charges is an
	// EINVALID error naming its parameter.
	ChargesList(ctx context.Context, p ChargesListParams) (ChargesPage, error)

	// Migrate applies the embedded schema; safe to run from several
	// instances at once.
	Migrate(ctx context.Context) error
	// Ping reports whether the database is reachable.
	Ping(ctx context.Context) error
	// Close releases the store's connections.
	Close() error

	// Outbox holds the results of queue intents until they are published.
	Outbox
	// Webhooks holds endpoints, settlement events and their deliveries.
	Webhooks
	// Refunds holds refunds, guarded by records of their own kind.
	Refunds
	// Operations holds captures and cancels of authorizations, guarded by
	// records of their own kinds.
	Operations
}

// CaptureRequest is what chargeonce sends the acquirer.
type CaptureRequest struct {
	Reference    string `json:"reference"`
	OrderID      int64  `json:"order_id"`
	Merchant     string `json:"merchant"`
	AmountCents  int64  `json:"amount_cents"`
	Currency     string `json:"currency"`
	PaymentToken string `json:"payment_token"`
}

// CaptureResult is the acquirer's definite answer.
type CaptureResult struct {
	Reference   string `json:"reference"`
	Status      Status `json:"status"`
	DeclineCode string `json:"decline_code,omitempty"`
}

// ErrCaptureRejected is matched (errors.Is) by a Capture error that is a
// definite refusal: the acquirer understood the request and will not
// capture it (an HTTP 4xx answer other than 404, 408, 409, 425 or 429). No
// money moved, and sending the same request again would be refused again,
// so the engine settles the charge as declined (DeclineAcquirerRejected)
// instead of re-driving it forever.
var ErrCaptureRejected = errors.New("the acquirer rejected the capture request")

// DeclineAcquirerRejected is the decline code of a charge whose capture the
// acquirer refused (ErrCaptureRejected).
const DeclineAcquirerRejected = "acquirer_rejected"

// Acquirer moves money.
//
// Capture is idempotent by reference, but only for a while: real acquirers
// keep idempotency keys for a window, after which a repeated request moves
// money again. A nil error means a definite answer (captured or declined);
// an error matching ErrCaptureRejected means the acquirer refused the
// request and moved no money; any other error means the outcome is unknown
// (timeout, 5xx, broken connection).
//
// Lookup asks what became of a reference without moving money, and answers
// honestly: LookupFound with the settled capture, LookupSafeToSend when
// sending the reference now cannot move money twice (the acquirer holds no
// capture under it, or still holds the reference's idempotency key so a
// re-send returns the first answer), and LookupUnsure (the zero value) when
// it cannot tell yet: a capture under way, a search index that lags, a
// proxy's bare 404. An error means the acquirer could not be asked.
// Recovery, and a retry that takes over an expired lease, look a reference
// up before sending it again and send it only on LookupSafeToSend, so that
// a reference the acquirer has forgotten is never captured twice.
type Acquirer interface {
	Capture(ctx context.Context, req CaptureRequest) (CaptureResult, error)
	Lookup(ctx context.Context, req LookupRequest) (LookupResult, error)
}

// LookupRequest asks an Acquirer what became of a reference.
type LookupRequest struct {
	Reference string
	// Age is how long ago the reference was first sent, at most (the
	// charge's age by the database's clock, KeyRecord.Age), when AgeKnown.
	// Adapters whose acquirer forgets idempotency keys, or whose search
	// lags, use it to tell "never seen" from "not seen yet". It is measured
	// on one clock, the database's: an instance's clock that runs behind
	// would make an old reference look young.
	Age      time.Duration
	AgeKnown bool
	// AcquirerID is the acquirer's own id for the reference, when one is
	// known (KeyRecord.AcquirerID): adapters retrieve it directly.
	AcquirerID string
	// Purpose says which question is asked: whether sending the reference
	// again is safe (recovery), or what happened (an operator's resolution).
	Purpose LookupPurpose
	// ChargeReference is, for a refund's reference, the refunded charge's
	// reference, and for a capture's or a void's, the authorized charge's:
	// adapters that find the operation through its charge (Stripe lists a
	// PaymentIntent's refunds, and a void leaves nothing but the canceled
	// PaymentIntent) need it. Empty for a charge's.
	ChargeReference string
	// Kind is the kind of record the reference is of: a charge's, a
	// refund's, a capture's or a cancel's (fences and adapters that keep
	// them apart need it).
	Kind RecordKind
}

// LookupPurpose is the question a lookup answers.
type LookupPurpose int

// The questions a lookup answers.
const (
	// LookupToResend: may the reference be sent again? LookupSafeToSend
	// may rest on the acquirer's idempotency window alone, without asking
	// it anything.
	LookupToResend LookupPurpose = iota
	// LookupToResolve: what happened to the reference? An operator settles
	// the charge from the answer, so the acquirer is always asked, and
	// LookupSafeToSend means it holds nothing under the reference.
	LookupToResolve
)

// LookupStatus is what a lookup learned about a reference.
type LookupStatus int

// The answers of a lookup. The zero value is LookupUnsure, so that an
// adapter that forgets to decide never lets a reference be sent twice.
const (
	// LookupUnsure: the acquirer's state cannot be known now; do not send
	// the reference, ask again later.
	LookupUnsure LookupStatus = iota
	// LookupFound: the reference settled; LookupResult.Result is its answer.
	LookupFound
	// LookupSafeToSend: sending the reference now cannot move money twice.
	LookupSafeToSend
)

// String returns the status's name, for logs.
func (s LookupStatus) String() string {
	switch s {
	case LookupFound:
		return "found"
	case LookupSafeToSend:
		return "safe-to-send"
	default:
		return "unsure"
	}
}

// LookupResult is the answer of Acquirer.Lookup.
type LookupResult struct {
	Status LookupStatus
	// Result is the settled capture when Status is LookupFound.
	Result CaptureResult
	// Refund is the settled refund when Status is LookupFound for a
	// refund's reference (Refunder.RefundLookup).
	Refund RefundResult
	// Operation is the settled capture or void when Status is LookupFound
	// for an operation's reference (ManualCapturer.OperationLookup).
	Operation OperationResult
	// Reason says why, for logs: why it is unsure, or why it is safe.
	Reason string
	// RetryAfter, when positive, is how long an unsure lookup suggests
	// waiting before asking again.
	RetryAfter time.Duration
	// AcquirerID is the acquirer's own id for the reference, when the
	// lookup learned one (a PaymentIntent found by search).
	AcquirerID string
	// Fenced is set by a Fencer's answer when the reference held nothing
	// and is now fenced: nothing can land under it any more (Status is
	// LookupSafeToSend).
	Fenced bool
	// Binding is set when the acquirer's own state decides the question so
	// that no operator may settle the charge otherwise, even with force: a
	// PaymentIntent that succeeded, is processing or awaits capture cannot
	// be declined, one that requires action cannot be captured. Result (or,
	// when unsure, Open) says what it allows.
	Binding bool
}

// Open reports an unsure answer that binds: the acquirer's object may still
// move money (processing, awaiting capture), so nobody may call it declined.
func (r LookupResult) Open() bool { return r.Binding && r.Status == LookupUnsure }

// LookupRequest asks about the record's reference, with what the record
// knows: its age by the database's clock and the acquirer's id, if any.
func (r *KeyRecord) LookupRequest(purpose LookupPurpose) LookupRequest {
	lr := LookupRequest{Reference: r.Reference(), Age: r.Age, AgeKnown: true, AcquirerID: r.AcquirerID, Purpose: purpose, Kind: r.Kind()}
	if r.Refund != nil || r.Operation != nil {
		lr.ChargeReference = r.Charge.Reference()
	}
	return lr
}

// AcquirerIDError is implemented by an acquirer's error that names the
// acquirer's own object for the reference (a PaymentIntent left processing):
// the engine records it (KeyAcquirerIDSet) so that later lookups retrieve
// that object. It is found anywhere in the error's chain.
type AcquirerIDError interface {
	error
	AcquirerID() string
}

// OutboxEntry is one result waiting to be published to the queue: the final
// answer of an intent a queue message asked to be told about (KeyNotify),
// written by the same statement that completed its record.
type OutboxEntry struct {
	ID             int64
	MerchantID     string
	Key            string
	ResponseStatus int
	ResponseBody   []byte
	CreatedAt      time.Time
}

// OutboxStats describe the results not yet published: how many, and the age
// of the oldest, by the database's clock.
type OutboxStats struct {
	Count     int
	OldestAge time.Duration
}

// Outbox is the part of the store the queue's transactional outbox uses. It
// is embedded in Store, so both stores implement it and storetest checks it.
type Outbox interface {
	// KeyNotify asks that the record's final answer be written to the
	// outbox when it is completed, by whichever attempt or recovery pass
	// completes it, in the same statement. flagged is false when the record
	// is not processing any more (already completed: the caller reads the
	// stored answer itself) or does not exist.
	KeyNotify(ctx context.Context, merchantID, key string) (flagged bool, err error)
	// OutboxClaim takes up to limit unpublished entries, oldest first, that
	// no other publisher holds, and holds them for lease. Concurrent callers
	// never get the same entry while its claim runs; an entry whose claim
	// ended without OutboxMarkSent is handed out again (published twice,
	// never lost).
	OutboxClaim(ctx context.Context, lease time.Duration, limit int) ([]OutboxEntry, error)
	// OutboxMarkSent removes published entries. Unknown ids are ignored.
	OutboxMarkSent(ctx context.Context, ids []int64) error
	// OutboxStats reports the entries not yet published.
	OutboxStats(ctx context.Context) (OutboxStats, error)
}

// CursorParam names the cursor parameter p uses, for its errors:
// ending_before or starting_after.
func (p *ChargesListParams) CursorParam() string {
	if p.EndingBefore != "" {
		return "ending_before"
	}
	return "starting_after"
}

// Check reports the first thing wrong with p as an EINVALID error that names
// the offending parameter (limit, status, starting_after, ending_before).
// Both stores call it, so they refuse the same requests.
func (p *ChargesListParams) Check() error {
	if p.Limit < 1 || p.Limit > ChargesListMaxLimit {
		return FieldError("limit", "limit must be between 1 and %d; got %d", ChargesListMaxLimit, p.Limit)
	}
	if p.Status != "" && !slices.Contains(Statuses, p.Status) {
		return FieldError("status", "status must be one of processing, authorized, captured, declined, canceled")
	}
	if p.StartingAfter != "" && p.EndingBefore != "" {
		return FieldError("ending_before", "starting_after and ending_before cannot both be given")
	}
	if p.OrderID < 0 {
		return FieldError("order_id", "order_id must be a positive 64-bit integer")
	}
	return nil
}
