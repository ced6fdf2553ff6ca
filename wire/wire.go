// Package wire reads the wire format of a charge request: the body of
// POST /v1/charges and of a queue message on charges.request.<merchant>.
// Both adapters (httpapi, queue) decode through it, so the same bytes get
// the same answer however they arrive.
//
// The reading is strict, because every reader in front of the service (a
// WAF, a fraud check, a log) must see the request that is charged. Go's
// encoding/json matches names case-insensitively and keeps the last of
// duplicate names, so {"amount_cents":25000,"Amount_Cents":1} would be
// charged 1 while a reader that keeps the first name sees 25000. Here a
// name must match exactly and appear once, at every level (metadata too);
// the body must be valid UTF-8 with no lone surrogate escape; anything else
// is a 400 naming the field. The decoder is github.com/go-json-experiment/json
// (what became encoding/json/v2), whose defaults are these rules.
package wire

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"github.com/chargeonce/chargeonce"
)

// MaxBodyBytes is the largest request body accepted (413 above it).
const MaxBodyBytes = 64 << 10

// strict is the decoding: exact-case names (the default), unique names (the
// default), valid UTF-8 (the default), and no unknown names.
var strict = json.JoinOptions(
	json.RejectUnknownMembers(true),
	json.MatchCaseInsensitiveNames(false),
	jsontext.AllowDuplicateNames(false),
	jsontext.AllowInvalidUTF8(false),
)

// DecodeChargeRequest decodes and validates the body of a charge request,
// defaults applied. Errors are EINVALID (naming the field) or ETOOLARGE.
func DecodeChargeRequest(body []byte) (chargeonce.ChargeRequest, error) {
	var req chargeonce.ChargeRequest
	if len(body) > MaxBodyBytes {
		return req, TooLarge()
	}
	if err := Decode(body, &req); err != nil {
		return req, err
	}
	if err := req.Normalize(); err != nil {
		return req, err
	}
	return req, nil
}

// DecodeRefundRequest decodes and validates the body of a refund request
// (POST /v1/charges/{id}/refunds, or a queue message with
// Chargeonce-Refund-Of). An empty body, or one without amount_cents,
// refunds what remains; an amount given must be positive (see
// decodeOperation). Errors are EINVALID (naming the field) or ETOOLARGE.
func DecodeRefundRequest(body []byte) (chargeonce.RefundRequest, error) {
	var req chargeonce.RefundRequest
	if err := decodeOperation(body, &req, &req.AmountCents, "refund what remains"); err != nil {
		return chargeonce.RefundRequest{}, err
	}
	if err := req.Normalize(); err != nil {
		return chargeonce.RefundRequest{}, err
	}
	return req, nil
}

// DecodeCaptureBody decodes and validates the body of a capture
// (POST /v1/charges/{id}/capture, or a queue message with
// Chargeonce-Capture-Of). An empty body, or one without amount_cents,
// captures the whole authorization; an amount given must be positive (see
// decodeOperation). Errors are EINVALID (naming the field) or ETOOLARGE.
func DecodeCaptureBody(body []byte) (chargeonce.CaptureBody, error) {
	var req chargeonce.CaptureBody
	if err := decodeOperation(body, &req, &req.AmountCents, "capture the whole authorization"); err != nil {
		return chargeonce.CaptureBody{}, err
	}
	if err := req.Normalize(); err != nil {
		return chargeonce.CaptureBody{}, err
	}
	return req, nil
}

// decodeOperation decodes the body of a refund or a capture strictly into
// dst, whose amount (amount_cents) is *amount; a body that is empty or
// only white space leaves dst as it is, as {} would. The domain types keep
// an amount left out as 0, "all of it", so a 0 sent would mean all of it
// too ({"amount_cents": 0} once refunded the whole charge): when the
// amount decoded is not positive the body is read once more for whether it
// names amount_cents, and an amount given that is not positive (0, a
// negative, null) is refused, naming the field. all says what leaving it
// out does.
func decodeOperation(body []byte, dst any, amount *int64, all string) error {
	if len(body) > MaxBodyBytes {
		return TooLarge()
	}
	if len(strings.TrimSpace(string(body))) == 0 {
		return nil
	}
	if err := Decode(body, dst); err != nil {
		return err
	}
	if *amount > 0 {
		return nil
	}
	// The strict read above accepted the body: this one only looks for the
	// name, whatever its value (null too, which the strict read took as 0).
	var named struct {
		AmountCents jsontext.Value `json:"amount_cents"`
	}
	if err := json.Unmarshal(body, &named); err != nil {
		return chargeonce.Errorf(chargeonce.EINVALID, "the body could not be decoded: %v", err)
	}
	if len(named.AmountCents) == 0 {
		return nil
	}
	return chargeonce.FieldError("amount_cents", "amount_cents must be a positive 64-bit integer (at least 1), or left out to %s; got %s", all, named.AmountCents)
}

// TooLarge is the error for a body over MaxBodyBytes.
func TooLarge() error {
	return chargeonce.Errorf(chargeonce.ETOOLARGE, "the body is larger than %d bytes", MaxBodyBytes)
}

// Decode decodes the one JSON value in body into dst strictly (see the
// package doc). Errors are EINVALID and name the top-level field they are
// in, when there is one; the message gives the full JSON pointer.
func Decode(body []byte, dst any) error {
	if len(strings.TrimSpace(string(body))) == 0 {
		return chargeonce.Errorf(chargeonce.EINVALID, "the body is empty; send a JSON object")
	}
	err := json.Unmarshal(body, dst, strict)
	if err == nil {
		return nil
	}
	var (
		se   *json.SemanticError
		syn  *jsontext.SyntacticError
		ptr  jsontext.Pointer
		at   int64
		what string
	)
	switch {
	case errors.As(err, &se):
		ptr, at = se.JSONPointer, se.ByteOffset
		what = semantic(se)
	case errors.As(err, &syn):
		ptr, at = syn.JSONPointer, syn.ByteOffset
		what = syntactic(syn)
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return chargeonce.Errorf(chargeonce.EINVALID, "the body is malformed JSON: it ends too early")
	default:
		return chargeonce.Errorf(chargeonce.EINVALID, "the body could not be decoded: %v", err)
	}
	field := topField(ptr)
	if field == "" {
		return chargeonce.Errorf(chargeonce.EINVALID, "the body %s (at byte %d)", what, at)
	}
	return chargeonce.FieldError(field, "%s %s (at byte %d)", pointerName(ptr), what, at)
}

// semantic says what is wrong with a value that is valid JSON.
func semantic(se *json.SemanticError) string {
	switch {
	case errors.Is(se.Err, json.ErrUnknownName):
		return "is not a known field (names are exact and case-sensitive)"
	case se.GoType != nil && se.JSONKind != 0:
		return fmt.Sprintf("must be %s; got %s", expected(se.GoType.Kind().String()), kindName(se.JSONKind, se.JSONValue))
	case se.Err != nil:
		return "is invalid: " + strings.TrimPrefix(se.Err.Error(), "json: ")
	default:
		return "is invalid"
	}
}

// syntactic says what is wrong with JSON that does not parse.
func syntactic(syn *jsontext.SyntacticError) string {
	switch {
	case errors.Is(syn.Err, jsontext.ErrDuplicateName):
		return "is given more than once; each name must appear once"
	case errors.Is(syn.Err, io.ErrUnexpectedEOF):
		return "is malformed JSON: it ends too early"
	case syn.Err != nil && strings.Contains(syn.Err.Error(), "UTF-8"):
		return "must be valid UTF-8"
	case syn.Err != nil && strings.Contains(syn.Err.Error(), "surrogate"):
		return "must not contain a lone surrogate escape: " + strings.TrimPrefix(syn.Err.Error(), "jsontext: ")
	case syn.Err != nil:
		return "is malformed JSON: " + strings.TrimPrefix(syn.Err.Error(), "jsontext: ")
	default:
		return "is malformed JSON"
	}
}

func expected(kind string) string {
	switch kind {
	case "int64", "int", "int32":
		return "a positive 64-bit integer"
	case "string":
		return "a string"
	case "map":
		return "an object of strings"
	case "struct":
		return "a JSON object"
	default:
		return "a JSON " + kind
	}
}

func kindName(k jsontext.Kind, v jsontext.Value) string {
	switch k {
	case '"':
		return "a string"
	case '0':
		if len(v) > 0 && len(v) <= 32 {
			return "the number " + string(v)
		}
		return "a number"
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	default:
		return "a JSON " + k.String()
	}
}

// topField is the top-level name of the JSON pointer, "" for the body itself.
func topField(p jsontext.Pointer) string {
	for tok := range p.Tokens() {
		return tok
	}
	return ""
}

// pointerName renders a pointer as a reader writes a field: amount_cents,
// metadata["order ref"].
func pointerName(p jsontext.Pointer) string {
	var b strings.Builder
	first := true
	for tok := range p.Tokens() {
		if first {
			b.WriteString(tok)
			first = false
			continue
		}
		fmt.Fprintf(&b, "[%q]", tok)
	}
	return b.String()
}
