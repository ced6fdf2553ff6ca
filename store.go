package chargeonce

import (
	"context"
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
	// RecoveryAttempts counts how often recovery re-drove the acquirer for
	// this record without reaching a final answer.
	RecoveryAttempts int
	ResponseStatus   int
	ResponseBody     []byte
	CreatedAt        time.Time
	ExpiresAt        time.Time
	Charge           Charge
}

// KeyInsertParams describe a new intent: its record and its processing charge.
type KeyInsertParams struct {
	Fingerprint string
	Token       string
	Lease       time.Duration
	TTL         time.Duration
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
}

// StuckStats describe processing records whose lease has ended: orphans that
// recovery has not yet settled. OldestAge is measured from the oldest such
// record's creation, so recovery's back-off does not reset it.
type StuckStats struct {
	Count     int
	OldestAge time.Duration
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
	// is never removed, expired or not: it is a charge recovery has not
	// settled yet.
	KeyInsert(ctx context.Context, p KeyInsertParams) (rec KeyRecord, inserted bool, err error)
	// KeyGet returns the record, or an ENOTFOUND error.
	KeyGet(ctx context.Context, merchantID, key string) (KeyRecord, error)
	// KeyComplete stores the final response and the charge's final status, if
	// and only if the record is still processing and owned by p.Token;
	// otherwise it returns an ESTALE error and changes nothing.
	KeyComplete(ctx context.Context, p KeyCompleteParams) error
	// KeyRelease deletes a processing record and its charge when owned by
	// token (the acquirer was never called), so a retry starts afresh.
	// ESTALE when token no longer owns it.
	KeyRelease(ctx context.Context, merchantID, key, token string) error
	// KeyLeaseSet moves the end of token's lease to now()+d (d may be zero:
	// the outcome is unknown and recovery may take over at once) and, when
	// recoveryAttempt is true, counts one more recovery attempt.
	// ESTALE when token no longer owns a processing record.
	KeyLeaseSet(ctx context.Context, merchantID, key, token string, d time.Duration, recoveryAttempt bool) error
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
	// first.
	ChargesListByOrder(ctx context.Context, merchantID string, orderID int64) ([]Charge, error)

	// Migrate applies the embedded schema; safe to run from several
	// instances at once.
	Migrate(ctx context.Context) error
	// Ping reports whether the database is reachable.
	Ping(ctx context.Context) error
	// Close releases the store's connections.
	Close() error

	// Outbox holds the results of queue intents until they are published.
	Outbox
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

// Acquirer moves money. Capture is idempotent by reference. A nil error
// means a definite answer (captured or declined); any error means the outcome
// is unknown (timeout, 5xx, broken connection) and the capture must be
// re-driven later with the same reference.
type Acquirer interface {
	Capture(ctx context.Context, req CaptureRequest) (CaptureResult, error)
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
