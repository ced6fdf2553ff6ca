package client

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"
)

// Status is the state of a charge.
type Status string

// The states a charge moves through. A charge is processing from the moment
// the service has recorded the intent until the acquirer's answer is known;
// it then ends captured or declined, and never changes again. A charge
// created with CaptureManual ends authorized instead, until Capture
// (captured) or Cancel, or its expiry, (canceled) settles it.
const (
	StatusProcessing Status = "processing"
	StatusAuthorized Status = "authorized"
	StatusCaptured   Status = "captured"
	StatusDeclined   Status = "declined"
	StatusCanceled   Status = "canceled"
)

// The capture methods of ChargeRequest.CaptureMethod.
const (
	CaptureAutomatic = "automatic"
	CaptureManual    = "manual"
)

// ChargeRequest is one payment intent: one customer paying one amount for
// one order.
type ChargeRequest struct {
	// OrderID and AmountCents are positive; both are required.
	OrderID     int64 `json:"order_id"`
	AmountCents int64 `json:"amount_cents"`
	// Currency is an ISO 4217 code in any letter case (the service answers
	// it upper case); empty means the service's default (BRL).
	Currency string `json:"currency,omitempty"`
	// PaymentToken stands for the card; required.
	PaymentToken string `json:"payment_token"`
	// Description is optional, at most 500 characters.
	Description string `json:"description,omitempty"`
	// Metadata is optional: at most 20 string values, keys 1 to 40
	// characters, values at most 500, stored and returned with the charge.
	Metadata map[string]string `json:"metadata,omitempty"`
	// CaptureMethod is CaptureManual to authorize only (see Capture and
	// Cancel); empty or CaptureAutomatic captures at once.
	CaptureMethod string `json:"capture_method,omitempty"`

	// IdempotencyKey identifies the intent. Leave it empty and CreateCharge
	// makes a random one for this call, used on all of the call's attempts.
	//
	// Set it yourself (NewIdempotencyKey makes a good one) whenever the
	// intent can outlive one call: store the key with the order before the
	// first call, and a process that crashed or timed out can call again
	// with the same key and learn the outcome instead of charging a second
	// time. A new key is a new payment.
	IdempotencyKey string `json:"-"`
}

// Charge is the service's charge object.
type Charge struct {
	ID          string `json:"id"`
	OrderID     int64  `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	Status      Status `json:"status"`
	// DeclineCode is set when Status is declined (JSON null otherwise).
	DeclineCode string    `json:"decline_code"`
	CreatedAt   time.Time `json:"created_at"`
	// CaptureMethod is CaptureManual for a charge that authorized only,
	// empty otherwise; AmountCapturedCents is then what its capture took
	// (zero until captured). Refunds are bounded by it.
	CaptureMethod       string `json:"capture_method,omitempty"`
	AmountCapturedCents int64  `json:"amount_captured_cents,omitempty"`
	// Metadata is what the request carried; nil when it had none.
	Metadata map[string]string `json:"metadata,omitempty"`

	// Replayed is true when the service answered with the response it had
	// stored for this key (the Idempotent-Replayed: true header): the
	// service finished this intent before this attempt. That is often an
	// earlier attempt of the same call whose answer was lost, so a replay
	// may be the only success the caller ever sees: it is no reason to
	// withhold the order. Fulfil once per intent, keyed by the intent (the
	// order or the stored idempotency key), whatever this flag says; it is
	// for logs and metrics, not for deciding whether to ship.
	Replayed bool `json:"-"`
	// Attempts is how many HTTP requests the call made to get this answer.
	Attempts int `json:"-"`
}

// MarshalJSON encodes c as the service does, with decline_code null when it
// is empty. Replayed and Attempts are not part of the charge object.
func (c Charge) MarshalJSON() ([]byte, error) {
	var decline *string
	if c.DeclineCode != "" {
		decline = &c.DeclineCode
	}
	var captured *int64
	if c.CaptureMethod == CaptureManual {
		captured = &c.AmountCapturedCents
	}
	return json.Marshal(struct {
		ID                  string            `json:"id"`
		OrderID             int64             `json:"order_id"`
		AmountCents         int64             `json:"amount_cents"`
		Currency            string            `json:"currency"`
		Status              Status            `json:"status"`
		DeclineCode         *string           `json:"decline_code"`
		CreatedAt           time.Time         `json:"created_at"`
		CaptureMethod       string            `json:"capture_method,omitempty"`
		AmountCapturedCents *int64            `json:"amount_captured_cents,omitempty"`
		Metadata            map[string]string `json:"metadata,omitempty"`
	}{c.ID, c.OrderID, c.AmountCents, c.Currency, c.Status, decline, c.CreatedAt, c.CaptureMethod, captured, c.Metadata})
}

// NewIdempotencyKey returns a random UUIDv4 (RFC 9562), the kind of key
// CreateCharge makes when the request carries none. Make one per payment
// intent, store it, and reuse it for every call about that intent.
func NewIdempotencyKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:])  // crypto/rand.Read never fails (Go 1.24+)
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // variant 10
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:], b[10:])
	return string(s[:])
}

// maxKeyLen is the longest idempotency key the service accepts.
const maxKeyLen = 255

// checkKey reports whether key can be sent as an Idempotency-Key. It is
// checked before any request: a key net/http refuses to send would otherwise
// look like a connection error and be retried for nothing.
func checkKey(key string) error {
	if key == "" || len(key) > maxKeyLen {
		return fmt.Errorf("the idempotency key must be 1 to %d characters; got %d", maxKeyLen, len(key))
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x21 || c > 0x7e {
			return fmt.Errorf("the idempotency key may hold only visible ASCII characters (0x21-0x7E); byte %d is 0x%02X", i, c)
		}
	}
	return nil
}

// keyHeader returns the Idempotency-Key header value for key. Keys are sent
// bare, as Stripe clients send them; a key that starts with a double quote
// would be read by the service as an RFC 8941 string, so it is sent as one.
func keyHeader(key string) string {
	if key[0] != '"' {
		return key
	}
	b := make([]byte, 0, len(key)+4)
	b = append(b, '"')
	for i := 0; i < len(key); i++ {
		if key[i] == '"' || key[i] == '\\' {
			b = append(b, '\\')
		}
		b = append(b, key[i])
	}
	return string(append(b, '"'))
}
