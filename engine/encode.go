package engine

import (
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/chargeonce/chargeonce"
)

// FinalResponse builds the response stored for a charge with a final status:
// 201 with the charge object when captured, 402 card-declined otherwise.
func FinalResponse(ch *chargeonce.Charge) Response {
	if ch.Status == chargeonce.StatusCaptured || ch.Status == chargeonce.StatusAuthorized {
		return Response{Status: 201, Body: EncodeCharge(ch)}
	}
	code := ch.DeclineCode
	if code == "" {
		code = "declined"
	}
	body, _ := json.Marshal(chargeonce.Problem{
		Type:        chargeonce.ProblemTypeBase + chargeonce.EDECLINED,
		Title:       "Card declined",
		Status:      402,
		Detail:      "The acquirer declined the charge (" + code + ").",
		ChargeID:    ch.ID,
		DeclineCode: code,
	})
	return Response{Status: 402, Body: body}
}

// EncodeCharge renders the public charge object. It is written by hand
// because it is on every request's path; the field order is fixed, which the
// byte-for-byte replay does not depend on (replays send stored bytes) but
// readers appreciate.
func EncodeCharge(ch *chargeonce.Charge) []byte {
	b := make([]byte, 0, 192)
	b = append(b, `{"id":`...)
	b = appendString(b, ch.ID)
	b = append(b, `,"order_id":`...)
	b = strconv.AppendInt(b, ch.OrderID, 10)
	b = append(b, `,"amount_cents":`...)
	b = strconv.AppendInt(b, ch.AmountCents, 10)
	b = append(b, `,"currency":`...)
	b = appendString(b, ch.Currency)
	b = append(b, `,"status":`...)
	b = appendString(b, string(ch.Status))
	b = append(b, `,"decline_code":`...)
	if ch.DeclineCode == "" {
		b = append(b, "null"...)
	} else {
		b = appendString(b, ch.DeclineCode)
	}
	b = append(b, `,"created_at":"`...)
	b = ch.CreatedAt.UTC().AppendFormat(b, time.RFC3339)
	b = append(b, '"')
	// Only a manual charge shows its capture method and what was captured,
	// so the bytes of an automatic charge are what they were before manual
	// capture existed (its replays and stored answers are unchanged).
	if ch.CaptureMethod == chargeonce.CaptureManual {
		b = append(b, `,"capture_method":"manual","amount_captured_cents":`...)
		b = strconv.AppendInt(b, ch.AmountCaptured(), 10)
	}
	// Only a charge that has metadata shows it, so the bytes of every
	// other charge are what they were before metadata existed.
	b = appendMetadata(b, ch.Metadata)
	return append(b, '}')
}

// appendMetadata appends `,"metadata":{…}` with the keys sorted, or
// nothing when m is empty.
func appendMetadata(b []byte, m map[string]string) []byte {
	if len(m) == 0 {
		return b
	}
	b = append(b, `,"metadata":{`...)
	for i, k := range slices.Sorted(maps.Keys(m)) {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, k)
		b = append(b, ':')
		b = appendString(b, m[k])
	}
	return append(b, '}')
}

// appendString appends s as a JSON string. Plain ASCII, which is what ids,
// currencies and statuses are, is copied; anything else goes through
// encoding/json so escaping is always right.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
