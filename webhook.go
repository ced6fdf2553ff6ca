package chargeonce

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// EndpointStatus is the state of a webhook endpoint.
type EndpointStatus string

// An endpoint is enabled when created; it is disabled when its receiver
// answers 410 Gone, or after it failed for WebhookDisableAfter. A disabled
// endpoint gets no new deliveries.
const (
	EndpointEnabled  EndpointStatus = "enabled"
	EndpointDisabled EndpointStatus = "disabled"
)

// Event types (SPEC "Settlement events and webhooks"). EventTest is sent
// by POST /v1/webhook_endpoints/{id}/test only: it is never recorded.
const (
	EventChargeCaptured = "charge.captured"
	EventChargeDeclined = "charge.declined"
	EventChargeCanceled = "charge.canceled"
	EventChargeRefunded = "charge.refunded"
	EventRefundCreated  = "refund.created"
	EventRefundUpdated  = "refund.updated"
	EventRefundFailed   = "refund.failed"
	EventTest           = "webhook.test"
)

// EventTypes are the types an endpoint may enable: every type recorded
// (SPEC "Money going back": each written by the statement that settles
// what it is about).
var EventTypes = []string{
	EventChargeCaptured, EventChargeDeclined, EventChargeCanceled, EventChargeRefunded,
	EventRefundCreated, EventRefundUpdated, EventRefundFailed, EventReconciliationCompleted,
}

// WebhookSecretOverlap is how long a rotated-out secret keeps signing
// deliveries beside the new one, so a receiver can switch secrets without
// refusing a delivery.
const WebhookSecretOverlap = 24 * time.Hour

// WebhookDisableAfter is how long an endpoint may keep failing (no 2xx
// since its first failure) before it is disabled.
const WebhookDisableAfter = 72 * time.Hour

// MaxWebhookEndpoints is how many endpoints one merchant may have. The
// stores enforce it atomically: concurrent creates never exceed it.
const MaxWebhookEndpoints = 16

// Limits of a page of events, as for charges.
const (
	EventsListDefaultLimit = 10
	EventsListMaxLimit     = 100
)

// EventAttemptsEmbedded is how many delivery attempts WebhookEventGet
// returns with an event: its most recent. An event redelivered without end
// once showed 3,647 (842 KB); the rest are read a page at a time
// (WebhookAttemptsList).
const EventAttemptsEmbedded = 20

// Limits of a page of delivery attempts.
const (
	AttemptsListDefaultLimit = 10
	AttemptsListMaxLimit     = 100
)

// Bounds of an endpoint's max_concurrency: how many deliveries to it one
// instance has in flight at once. 0 stored means the default.
const (
	DefaultEndpointConcurrency = 16
	MaxEndpointConcurrency     = 64
)

// WebhookEndpoint is a merchant's receiver of settlement events.
type WebhookEndpoint struct {
	ID          string
	MerchantID  string
	URL         string
	Description string
	// MaxConcurrency bounds the deliveries to the endpoint one instance has
	// in flight at once (1 to MaxEndpointConcurrency); 0 means
	// DefaultEndpointConcurrency.
	MaxConcurrency int
	// EnabledEvents are the event types the endpoint receives; nil for
	// every type.
	EnabledEvents []string
	Status        EndpointStatus
	// DisabledReason says why a disabled endpoint was disabled.
	DisabledReason string
	// Secret signs every delivery. OldSecret, until OldSecretUntil, signs
	// them too (a rotation's overlap).
	Secret         string
	OldSecret      string
	OldSecretUntil time.Time
	CreatedAt      time.Time
}

// Secrets returns the secrets that sign a delivery made at now: the current
// one, and the rotated-out one while its overlap lasts.
func (e *WebhookEndpoint) Secrets(now time.Time) []string {
	s := []string{e.Secret}
	if e.OldSecret != "" && now.Before(e.OldSecretUntil) {
		s = append(s, e.OldSecret)
	}
	return s
}

// Concurrency is how many deliveries to the endpoint one instance has in
// flight at once.
func (e *WebhookEndpoint) Concurrency() int {
	if e.MaxConcurrency <= 0 {
		return DefaultEndpointConcurrency
	}
	return min(e.MaxConcurrency, MaxEndpointConcurrency)
}

// CheckEndpointConcurrency reports a max_concurrency out of its bounds as an
// EINVALID error naming it. Both stores call it.
func CheckEndpointConcurrency(n int) error {
	if n < 1 || n > MaxEndpointConcurrency {
		return FieldError("max_concurrency", "max_concurrency must be between 1 and %d; got %d", MaxEndpointConcurrency, n)
	}
	return nil
}

// WebhookEndpointUpdate changes an endpoint: each field set is applied.
type WebhookEndpointUpdate struct {
	// Disabled, when set, disables the endpoint (ending its pending
	// deliveries) or enables it again (its failure clock starts afresh).
	Disabled *bool
	// EnabledEvents, when set, replaces the endpoint's event types; an
	// empty slice means every type.
	EnabledEvents *[]string
	Description   *string
	// MaxConcurrency, when set, replaces the endpoint's (1 to
	// MaxEndpointConcurrency).
	MaxConcurrency *int
}

// Bounds of "recover failed since T" (POST
// /v1/webhook_endpoints/{id}/recover), which owed once one delivery per
// failed event, uncapped: one merchant cycling disable, enable and recover
// over 3,000 events inserted 130,463 deliveries in 40 s, and another
// merchant's charges went from p95 23 ms to 1.4 s (issue 48). A call
// queues at most WebhookRecoverLimit (the rest from its cursor), and an
// endpoint is recovered at most once every WebhookRecoverCooldown: at most
// WebhookRecoverLimit/WebhookRecoverCooldown deliveries a second an
// endpoint, 320 for a merchant's 16, as many as redeliveries allow.
const (
	WebhookRecoverLimit    = 100
	WebhookRecoverCooldown = 5 * time.Second
)

// WebhookRecoverParams select what one WebhookEndpointRecover queues.
type WebhookRecoverParams struct {
	MerchantID string
	EndpointID string
	// Since: the failed deliveries made at or after it (a cursor's Next).
	Since time.Time
	// Limit bounds the failed deliveries read, hence those queued.
	Limit int
	// Cooldown is the least time between two recoveries of the endpoint;
	// a call sooner is refused ERATELIMITED.
	Cooldown time.Duration
}

// CooldownError refuses a recovery within the endpoint's cooldown; wait
// is what is left of it (a second at least: a recovery that raced this
// one may have started it afresh). Both stores return it.
func (p WebhookRecoverParams) CooldownError(wait time.Duration) error {
	return &Error{
		Code: ERATELIMITED,
		Message: fmt.Sprintf("webhook endpoint %s was recovered less than %s ago: go on (since the last call's next_since) after the time in Retry-After",
			p.EndpointID, p.Cooldown),
		RetryAfter: max(wait, time.Second),
	}
}

// WebhookRecovered is what one WebhookEndpointRecover did.
type WebhookRecovered struct {
	// Queued counts the deliveries owed again.
	Queued int
	// HasMore tells that Limit failed deliveries were read: there may be
	// more from Next on (Since of the next call). What this call queued
	// is owed now, so the next call does not queue it again.
	HasMore bool
	Next    time.Time
}

// WebhookEvent is the settlement of one charge, written in the transaction
// that settled it, whether or not its merchant had an enabled endpoint
// then: events are the log. Its ID is derived from the charge's, so a
// charge can have one event only.
type WebhookEvent struct {
	ID         string
	MerchantID string
	// ChargeID is the charge the event is about, or whose refund it is
	// about.
	ChargeID string
	// ObjectID is the refund (re_…) a refund.* or charge.refunded event
	// is about; "" for a charge's settlement.
	ObjectID  string
	Type      string
	CreatedAt time.Time
}

// SettlementEventID is the id of the event of charge chargeID's settlement
// (charge.captured, .declined or .canceled): derived from the charge's, as
// the statement that settles it writes it. A refund's events have ids of
// their own.
func SettlementEventID(chargeID string) string {
	return "evt_" + strings.TrimPrefix(chargeID, "ch_")
}

// WebhookAttempt is one try at delivering an event to an endpoint.
type WebhookAttempt struct {
	// ID orders an event's attempts (a later attempt has a larger ID).
	ID         int64
	EventID    string
	EndpointID string
	At         time.Time
	// StatusCode is the receiver's HTTP status, zero when none came back
	// (Error says why).
	StatusCode int
	Error      string
	Latency    time.Duration
}

// WebhookDelivery is an event owed to one endpoint, claimed by a sender.
type WebhookDelivery struct {
	ID int64
	// Token identifies the claim; finishing the delivery is a
	// compare-and-set on it.
	Token string
	// Attempts counts the tries made before this one.
	Attempts int
	Event    WebhookEvent
	Endpoint WebhookEndpoint
	// Charge, when not nil, is the charge the event is about, read with
	// the claim (PostgreSQL: one statement for the batch). The sender reads
	// the event's object itself otherwise (a refund's event, SQLite).
	Charge *Charge
}

// WebhookFinish is one claimed delivery and what its attempt came to, for
// WebhookDeliveriesFinish; the store sets Disabled and Err.
type WebhookFinish struct {
	Delivery WebhookDelivery
	Outcome  WebhookOutcome
	// Disabled tells whether recording it disabled the endpoint.
	Disabled bool
	// Err is what WebhookDeliveryFinish would return: nil, ESTALE when
	// the claim was lost (the attempt is still recorded), or the error that
	// kept it from being recorded.
	Err error
}

// WebhookOutcome is what one delivery attempt came to.
type WebhookOutcome struct {
	Attempt WebhookAttempt
	// Delivered is true on a 2xx: the delivery is done.
	Delivered bool
	// RetryIn, when not delivered, is when to try again; zero gives up.
	RetryIn time.Duration
	// Disable, when not empty, disables the endpoint at once (a 410) with
	// this reason, and ends its pending deliveries.
	Disable string
	// DisableAfter, when positive, disables the endpoint when this attempt
	// failed and the endpoint has had no 2xx for that long.
	DisableAfter time.Duration
}

// DeliveryState is the state a delivery is left in by this outcome
// ("succeeded", "failed" or "pending") and, when pending, how long until
// its next attempt: the stores' one rule.
func (o WebhookOutcome) DeliveryState() (state string, next time.Duration) {
	switch {
	case o.Delivered:
		return "succeeded", 0
	case o.Disable != "" || o.RetryIn <= 0:
		return "failed", 0
	default:
		return "pending", o.RetryIn
	}
}

// Disables is the disable rule, the stores' one: whether this outcome, a
// failed attempt, disables an endpoint now in status, and the reason it
// records. A 410 (Disable) disables an enabled endpoint at once; any other
// failure does, when DisableAfter is positive, once the endpoint has had
// no 2xx for that long (failingLong: the store measures its failure clock
// against DisableAfter on the database's clock). A delivered outcome, or an
// endpoint disabled already, disables nothing.
func (o WebhookOutcome) Disables(status EndpointStatus, failingLong bool) (disable bool, reason string) {
	if o.Delivered || status != EndpointEnabled || (o.Disable == "" && (o.DisableAfter <= 0 || !failingLong)) {
		return false, ""
	}
	if o.Disable != "" {
		return true, o.Disable
	}
	return true, fmt.Sprintf("no 2xx for %s", o.DisableAfter)
}

// WebhookStats describe deliveries not yet made, by the database's clock.
type WebhookStats struct {
	Pending           int
	OldestPendingAge  time.Duration
	EndpointsDisabled int
}

// EventsListParams select one page of a merchant's events, newest first.
type EventsListParams struct {
	MerchantID string
	// ChargeID, when not empty, keeps only that charge's event.
	ChargeID string
	Limit    int
	// StartingAfter, an event id, asks for the events older than it.
	StartingAfter string
}

// EventsPage is one page of events, newest first.
type EventsPage struct {
	Events  []WebhookEvent
	HasMore bool
}

// AttemptsListParams select one page of an event's delivery attempts,
// newest first.
type AttemptsListParams struct {
	MerchantID string
	EventID    string
	Limit      int
	// StartingAfter, an attempt's ID, asks for the attempts older than it.
	StartingAfter int64
}

// AttemptsPage is one page of attempts, newest first.
type AttemptsPage struct {
	Attempts []WebhookAttempt
	HasMore  bool
}

// Check reports the first thing wrong with p as an EINVALID error naming
// its parameter. Both stores call it.
func (p *AttemptsListParams) Check() error {
	if p.Limit < 1 || p.Limit > AttemptsListMaxLimit {
		return FieldError("limit", "limit must be between 1 and %d; got %d", AttemptsListMaxLimit, p.Limit)
	}
	if p.StartingAfter < 0 {
		return FieldError("starting_after", "starting_after must be an attempt's id")
	}
	return nil
}

// Webhooks is the part of the store behind settlement webhooks. Events are
// written by the statement that completes an idempotency record (KeyComplete
// and its batched form), never by a separate call, so a settled charge and
// its event commit together. It is embedded in Store; storetest checks both
// stores.
type Webhooks interface {
	// WebhookEndpointCreate stores a new enabled endpoint (ID, MerchantID,
	// URL, Description and Secret set by the caller) and returns it with
	// its creation time.
	WebhookEndpointCreate(ctx context.Context, e WebhookEndpoint) (WebhookEndpoint, error)
	// WebhookEndpointsList returns the merchant's endpoints, oldest first.
	WebhookEndpointsList(ctx context.Context, merchantID string) ([]WebhookEndpoint, error)
	// WebhookEndpointDelete removes the merchant's endpoint and its pending
	// deliveries; ENOTFOUND when it has no such endpoint.
	WebhookEndpointDelete(ctx context.Context, merchantID, id string) error
	// WebhookEndpointUpdate applies u to the merchant's endpoint and
	// returns it; ENOTFOUND when the merchant has no such endpoint.
	WebhookEndpointUpdate(ctx context.Context, merchantID, id string, u WebhookEndpointUpdate) (WebhookEndpoint, error)
	// WebhookEndpointRecover owes again, once each and due now, the events
	// whose delivery to the endpoint failed at or after p.Since, that the
	// endpoint's enabled_events name and that it has neither received nor
	// still owes: the first p.Limit such failed deliveries, oldest first
	// (see WebhookRecovered). ENOTFOUND when the merchant has no such
	// endpoint; EINVALID when the endpoint is disabled; ERATELIMITED, with
	// RetryAfter, within p.Cooldown of the endpoint's last recovery.
	WebhookEndpointRecover(ctx context.Context, p WebhookRecoverParams) (WebhookRecovered, error)
	// WebhookEndpointRotate makes secret the endpoint's secret; the old one
	// keeps signing for overlap. ENOTFOUND when the merchant has no such
	// endpoint.
	WebhookEndpointRotate(ctx context.Context, merchantID, id, secret string, overlap time.Duration) (WebhookEndpoint, error)

	// WebhookEventGet returns the merchant's event with its most recent
	// delivery attempts (EventAttemptsEmbedded at most), oldest first;
	// ENOTFOUND otherwise.
	WebhookEventGet(ctx context.Context, merchantID, id string) (WebhookEvent, []WebhookAttempt, error)
	// WebhookAttemptsList returns one page of the delivery attempts of the
	// merchant's event, newest first; ENOTFOUND when the merchant has no
	// such event.
	WebhookAttemptsList(ctx context.Context, p AttemptsListParams) (AttemptsPage, error)
	// WebhookEventsList returns one page of the merchant's events. A cursor
	// that is not one of the merchant's events is an EINVALID error.
	WebhookEventsList(ctx context.Context, p EventsListParams) (EventsPage, error)
	// WebhookEventRedeliver owes the event once more to every enabled
	// endpoint of its merchant, due now, and returns how many deliveries it
	// queued; ENOTFOUND when the merchant has no such event.
	WebhookEventRedeliver(ctx context.Context, merchantID, id string) (int, error)

	// WebhookDeliveriesClaim takes up to limit due deliveries that no
	// sender holds, holding each for lease with a fresh token, at most
	// perMerchant of any one merchant and none of the merchants in skip.
	// Concurrent callers never get the same delivery while its claim runs;
	// a claim that ends without WebhookDeliveryFinish is handed out again.
	WebhookDeliveriesClaim(ctx context.Context, lease time.Duration, limit, perMerchant int, skip []string) ([]WebhookDelivery, error)
	// WebhookDeliveryFinish records the attempt and, if d's claim still
	// holds, ends the delivery or schedules its next try (see
	// WebhookOutcome). disabled tells whether it disabled the endpoint.
	// ESTALE when the claim was lost (the attempt is still recorded).
	WebhookDeliveryFinish(ctx context.Context, d WebhookDelivery, o WebhookOutcome) (disabled bool, err error)
	// WebhookDeliveriesFinish does what WebhookDeliveryFinish does for
	// each of fs, setting its Disabled and Err; the delivered ones (the
	// common case) are recorded together, in one statement.
	WebhookDeliveriesFinish(ctx context.Context, fs []WebhookFinish)
	// WebhookStats reports pending deliveries and disabled endpoints.
	WebhookStats(ctx context.Context) (WebhookStats, error)
}

// Check reports the first thing wrong with p as an EINVALID error naming
// its parameter. Both stores call it.
func (p *EventsListParams) Check() error {
	if p.Limit < 1 || p.Limit > EventsListMaxLimit {
		return FieldError("limit", "limit must be between 1 and %d; got %d", EventsListMaxLimit, p.Limit)
	}
	return nil
}
