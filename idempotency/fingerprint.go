package idempotency

import (
	"crypto/sha256"
	"encoding/base64"
	"maps"
	"slices"
	"strconv"

	"github.com/chargeonce/chargeonce"
)

// Fingerprint identifies a request for the purpose of "same key, different
// request" (422). Two requests are the same when their method, path and
// decoded body after defaults are equal, so whitespace and field order in the
// JSON do not matter: the fingerprint is computed over the decoded fields in
// a fixed order, each length-prefixed so no two different requests can
// collide by concatenation.
//
// Metadata is appended only when the request has some, after a marker no
// other field can produce (the fields before it end in a length-prefixed
// string), with its entries sorted by key: so a request without metadata
// keeps the fingerprint it had before metadata existed, and keys stored
// then still recognise their retries.
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
	b = appendMetadata(b, r.Metadata)
	if r.CaptureMethod == chargeonce.CaptureManual {
		// Only a manual charge says so: an automatic charge's fingerprint
		// is what it was before capture methods existed, so that its
		// retries still replay instead of answering 422.
		b = append(b, "\x00capture_method:manual"...)
	}
	return sum(b)
}

// OperationFingerprint identifies a capture (kind chargeonce.KindCapture)
// or a cancel of chargeID as Fingerprint does a charge's: method, path and
// decoded body. A capture's amount left out is 0 here.
func OperationFingerprint(kind chargeonce.RecordKind, chargeID string, amountCents int64) string {
	var buf [128]byte
	b := buf[:0]
	b = appendField(b, "POST")
	b = appendField(b, "/v1/charges/"+chargeID+"/"+string(kind))
	b = strconv.AppendInt(b, amountCents, 10)
	return sum(b)
}

// RefundFingerprint identifies a refund request of chargeID as Fingerprint
// does a charge's: method, path and decoded body. An amount left out (the
// rest of the charge) is 0 here, whatever remains when it is inserted, so a
// retry is the same request however the charge's other refunds went.
func RefundFingerprint(chargeID string, r *chargeonce.RefundRequest) string {
	var buf [512]byte
	b := buf[:0]
	b = appendField(b, "POST")
	b = appendField(b, "/v1/charges/"+chargeID+"/refunds")
	b = strconv.AppendInt(b, r.AmountCents, 10)
	b = append(b, 0)
	b = appendField(b, r.Reason)
	return sum(appendMetadata(b, r.Metadata))
}

// appendMetadata appends metadata, when there is some, after a marker no
// other field can produce, entries sorted by key.
func appendMetadata(b []byte, m map[string]string) []byte {
	if len(m) == 0 {
		return b
	}
	b = append(b, "\x00metadata"...)
	b = strconv.AppendInt(b, int64(len(m)), 10)
	for _, k := range slices.Sorted(maps.Keys(m)) {
		b = appendField(b, k)
		b = appendField(b, m[k])
	}
	return b
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	// Encoded into an array, then one string: EncodeToString allocates
	// its buffer and the string both, on every charge and every replay.
	var out [43]byte // base64.RawStdEncoding.EncodedLen(sha256.Size)
	base64.RawStdEncoding.Encode(out[:], s[:])
	return string(out[:])
}

func appendField(b []byte, s string) []byte {
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, ':')
	return append(b, s...)
}
