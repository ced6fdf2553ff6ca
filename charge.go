package chargeonce

import (
	"time"
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
