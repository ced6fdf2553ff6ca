package chargeonce

import (
	"time"
	"unicode/utf8"

	"golang.org/x/text/currency"
)

// Status is the state of a charge.
type Status string

// The states a charge moves through. A charge starts processing when its
// idempotency record is inserted and ends captured or declined once the
// acquirer has answered (directly, or through recovery).
const (
	StatusProcessing Status = "processing"
	StatusCaptured   Status = "captured"
	StatusDeclined   Status = "declined"
)

// DefaultCurrency is the currency a charge request gets when it names none.
const DefaultCurrency = "BRL"

// Charge is one attempt to move money for an intent. Its ID doubles as the
// reference sent to the acquirer, so re-driving a charge can never create a
// second capture.
type Charge struct {
	ID             string
	MerchantID     string
	IdempotencyKey string
	OrderID        int64
	AmountCents    int64
	Currency       string
	PaymentToken   string
	Description    string
	Status         Status
	DeclineCode    string
	CreatedAt      time.Time
}

// Reference is the identifier the acquirer deduplicates on.
func (c *Charge) Reference() string { return c.ID }

// ChargeRequest is the decoded body of POST /v1/charges, after defaults.
type ChargeRequest struct {
	OrderID      int64  `json:"order_id"`
	AmountCents  int64  `json:"amount_cents"`
	Currency     string `json:"currency"`
	PaymentToken string `json:"payment_token"`
	Description  string `json:"description,omitempty"`
}

// Merchant is an API client. Idempotency keys and charges are scoped to it.
type Merchant struct {
	ID string
}

// Limits on a charge request's fields.
const (
	MaxPaymentTokenLen = 255
	MaxDescriptionLen  = 500
)

// Normalize applies defaults and validates the request. Errors are EINVALID
// and name the offending field.
func (r *ChargeRequest) Normalize() error {
	if r.Currency == "" {
		r.Currency = DefaultCurrency
	}
	if r.OrderID <= 0 {
		return FieldError("order_id", "order_id must be a positive 64-bit integer")
	}
	if r.AmountCents <= 0 {
		return FieldError("amount_cents", "amount_cents must be a positive 64-bit integer")
	}
	if !validCurrency(r.Currency) {
		return FieldError("currency", "currency must be an upper-case ISO 4217 code such as BRL or USD; got %q", r.Currency)
	}
	if n := len(r.PaymentToken); n == 0 || n > MaxPaymentTokenLen {
		return FieldError("payment_token", "payment_token must be 1 to %d visible characters", MaxPaymentTokenLen)
	}
	for i := 0; i < len(r.PaymentToken); i++ {
		if c := r.PaymentToken[i]; c < 0x21 || c > 0x7e {
			return FieldError("payment_token", "payment_token must be 1 to %d visible characters", MaxPaymentTokenLen)
		}
	}
	if n := utf8.RuneCountInString(r.Description); n > MaxDescriptionLen {
		return FieldError("description", "description must be at most %d characters; got %d", MaxDescriptionLen, n)
	}
	return nil
}

func validCurrency(c string) bool {
	if len(c) != 3 {
		return false
	}
	for i := 0; i < 3; i++ {
		if c[i] < 'A' || c[i] > 'Z' {
			return false
		}
	}
	_, err := currency.ParseISO(c)
	return err == nil
}
