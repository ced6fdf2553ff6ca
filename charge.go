package chargeonce

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"golang.org/x/text/currency"
)

// Status is the state of a charge.
type Status string

// The states a charge moves through. A charge starts processing when its
// idempotency record is inserted and ends captured or declined once the
// acquirer has answered (directly, or through recovery). A charge with
// manual capture (CaptureManual) ends its first drive authorized instead of
// captured, and a capture (captured) or a cancel (canceled) settles it
// later; an authorization nobody captures is canceled when it expires.
const (
	StatusProcessing Status = "processing"
	StatusAuthorized Status = "authorized"
	StatusCaptured   Status = "captured"
	StatusDeclined   Status = "declined"
	StatusCanceled   Status = "canceled"
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
	// Metadata is the client's own key-value pairs, stored and returned
	// with the charge; nil when it has none.
	Metadata    map[string]string
	Status      Status
	DeclineCode string
	CreatedAt   time.Time
	// CaptureMethod is CaptureManual for a charge that only authorizes,
	// and empty (automatic) otherwise.
	CaptureMethod CaptureMethod
	// CapturedCents is what a manual capture took (at most AmountCents);
	// zero until then, and for an automatic charge, whose captured amount
	// is AmountCents (see AmountCaptured).
	CapturedCents int64
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
	// Metadata is nil when the request has none; Normalize turns an empty
	// object into nil, so {} and no metadata are the same request.
	Metadata map[string]string `json:"metadata,omitempty"`
	// CaptureMethod is CaptureManual to authorize only; "automatic" and
	// leaving it out are the same request (Normalize makes both empty).
	CaptureMethod CaptureMethod `json:"capture_method,omitempty"`
}

// Merchant is an API client. Idempotency keys and charges are scoped to it.
type Merchant struct {
	ID string
}

// Limits on a charge request's fields.
const (
	MaxPaymentTokenLen = 255
	MaxDescriptionLen  = 500

	// MaxMetadataEntries, MaxMetadataKeyLen and MaxMetadataValueLen bound
	// a request's metadata (SPEC "POST /v1/charges"); lengths are in
	// characters.
	MaxMetadataEntries  = 20
	MaxMetadataKeyLen   = 40
	MaxMetadataValueLen = 500
)

// Normalize applies defaults and validates the request. Errors are EINVALID
// and name the offending field.
func (r *ChargeRequest) Normalize() error {
	if r.Currency == "" {
		r.Currency = DefaultCurrency
	}
	// "brl" is accepted, as Stripe writes it, and means BRL: the stored
	// and answered currency is always upper case, and the fingerprint is
	// taken after this, so both spellings are the same request.
	r.Currency = upperASCII(r.Currency)
	if r.OrderID <= 0 {
		return FieldError("order_id", "order_id must be a positive 64-bit integer")
	}
	if r.AmountCents <= 0 {
		return FieldError("amount_cents", "amount_cents must be a positive 64-bit integer")
	}
	if !validCurrency(r.Currency) {
		return FieldError("currency", "currency must be an ISO 4217 code such as BRL or USD; got %q", r.Currency)
	}
	if n := len(r.PaymentToken); n == 0 || n > MaxPaymentTokenLen {
		return FieldError("payment_token", "payment_token must be 1 to %d visible characters", MaxPaymentTokenLen)
	}
	for i := 0; i < len(r.PaymentToken); i++ {
		if c := r.PaymentToken[i]; c < 0x21 || c > 0x7e {
			return FieldError("payment_token", "payment_token must be 1 to %d visible characters", MaxPaymentTokenLen)
		}
	}
	if !ValidText(r.Description) {
		return FieldError("description", "description must be valid UTF-8 without U+0000")
	}
	if n := utf8.RuneCountInString(r.Description); n > MaxDescriptionLen {
		return FieldError("description", "description must be at most %d characters; got %d", MaxDescriptionLen, n)
	}
	switch r.CaptureMethod {
	case "", CaptureAutomatic:
		r.CaptureMethod = ""
	case CaptureManual:
	default:
		return FieldError("capture_method", "capture_method must be \"automatic\" or \"manual\"; got %q", string(r.CaptureMethod))
	}
	return r.normalizeMetadata()
}

func (r *ChargeRequest) normalizeMetadata() error {
	if len(r.Metadata) == 0 {
		r.Metadata = nil
		return nil
	}
	if n := len(r.Metadata); n > MaxMetadataEntries {
		return FieldError("metadata", "metadata must have at most %d entries; got %d", MaxMetadataEntries, n)
	}
	for k, v := range r.Metadata {
		if !ValidText(k) || !ValidText(v) {
			return FieldError("metadata", "metadata[%q] must be valid UTF-8 without U+0000", k)
		}
		if n := utf8.RuneCountInString(k); n == 0 || n > MaxMetadataKeyLen {
			return FieldError("metadata", "metadata keys must be 1 to %d characters; %q has %d", MaxMetadataKeyLen, k, n)
		}
		if n := utf8.RuneCountInString(v); n > MaxMetadataValueLen {
			return FieldError("metadata", "metadata[%q] must be at most %d characters; got %d", k, MaxMetadataValueLen, n)
		}
	}
	return nil
}

// upperASCII upper-cases the ASCII letters of s, leaving anything else
// (which validCurrency then refuses) as it is.
func upperASCII(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'a' && c <= 'z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if b[j] >= 'a' && b[j] <= 'z' {
					b[j] -= 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
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

// ValidText reports whether s is text every store keeps byte for byte and
// every client can read back: valid UTF-8 (which also excludes UTF-16
// surrogates) with no U+0000. PostgreSQL's text type refuses both; SQLite
// would store them, so the stores check it at their boundary and the API
// refuses such text at the edge.
func ValidText(s string) bool {
	return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}

// CheckText refuses an insert whose text fields are not ValidText, with an
// EINVALID error naming the field. Both stores call it first, so a NUL byte
// or invalid UTF-8 that slipped past the edge gets the same answer from
// PostgreSQL (which cannot store it) and SQLite (which could).
func (p *KeyInsertParams) CheckText() error {
	for _, f := range []struct{ name, value string }{
		{"merchant_id", p.Charge.MerchantID},
		{"idempotency_key", p.Charge.IdempotencyKey},
		{"currency", p.Charge.Currency},
		{"payment_token", p.Charge.PaymentToken},
		{"description", p.Charge.Description},
		{"id", p.Charge.ID},
		{"fingerprint", p.Fingerprint},
		{"token", p.Token},
	} {
		if !ValidText(f.value) {
			return FieldError(f.name, "%s must be valid UTF-8 without U+0000", f.name)
		}
	}
	for k, v := range p.Charge.Metadata {
		if !ValidText(k) || !ValidText(v) {
			return FieldError("metadata", "metadata must be valid UTF-8 without U+0000")
		}
	}
	if m := p.Charge.CaptureMethod; m != "" && m != CaptureManual {
		return FieldError("capture_method", "capture_method must be manual or left empty (automatic); got %q", string(m))
	}
	return nil
}

// MetadataText is how both stores keep a charge's metadata: the JSON text
// of the object, keys sorted; nil when the charge has none, so a charge
// without metadata stores NULL as before metadata existed.
func MetadataText(m map[string]string) *string {
	if len(m) == 0 {
		return nil
	}
	b, err := json.Marshal(m) // sorts the keys
	if err != nil {
		panic("chargeonce: encoding metadata: " + err.Error()) // a map of strings always encodes
	}
	s := string(b)
	return &s
}

// ParseMetadataText is MetadataText's inverse; NULL (nil) and "" are no
// metadata.
func ParseMetadataText(s *string) (map[string]string, error) {
	if s == nil || *s == "" {
		return nil, nil
	}
	var m map[string]string
	if err := json.Unmarshal([]byte(*s), &m); err != nil {
		return nil, fmt.Errorf("decoding stored metadata: %w", err)
	}
	if len(m) == 0 {
		return nil, nil
	}
	return m, nil
}
