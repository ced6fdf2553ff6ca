package idempotency

import (
	"crypto/sha256"
	"encoding/base64"
	"strconv"

	"github.com/chargeonce/chargeonce"
)

// Fingerprint identifies a request for the purpose of "same key, different
// request" (422). Two requests are the same when their method, path and
// decoded body after defaults are equal, so whitespace and field order in the
// JSON do not matter: the fingerprint is computed over the decoded fields in
// a fixed order, each length-prefixed so no two different requests can
// collide by concatenation.
func Fingerprint(method, path string, r *chargeonce.ChargeRequest) string {
	var buf [512]byte
	b := buf[:0]
	b = appendField(b, method)
	b = appendField(b, path)
	b = strconv.AppendInt(b, r.OrderID, 10)
	b = append(b, 0)
	b = strconv.AppendInt(b, r.AmountCents, 10)
	b = append(b, 0)
	b = appendField(b, r.Currency)
	b = appendField(b, r.PaymentToken)
	b = appendField(b, r.Description)
	sum := sha256.Sum256(b)
	return base64.RawStdEncoding.EncodeToString(sum[:])
}

func appendField(b []byte, s string) []byte {
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, ':')
	return append(b, s...)
}
