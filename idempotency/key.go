// Package idempotency holds the pieces of the idempotency protocol that do
// not depend on a database: parsing the Idempotency-Key header, the request
// fingerprint that tells a retry from a reused key, and per-attempt tokens.
package idempotency

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"time"

	"github.com/chargeonce/chargeonce"
)

// MaxKeyLen is the longest idempotency key accepted, in bytes.
const MaxKeyLen = 255

// ParseKey returns the idempotency key carried by the Idempotency-Key header
// values (as http.Header.Values returns them).
//
// The key may come bare (abc-123, as Stripe clients send it) or as an RFC 8941
// structured-field string ("abc-123", as the IETF draft writes it); both mean
// abc-123. Either way the key itself must be 1 to MaxKeyLen visible ASCII
// characters (0x21-0x7E). A missing header is EMISSINGKEY; anything else that
// is not a key (several headers, bad quoting, parameters, control or
// non-ASCII bytes, too long) is EINVALIDKEY.
func ParseKey(values []string) (string, error) {
	if len(values) == 0 {
		return "", chargeonce.Errorf(chargeonce.EMISSINGKEY, "the Idempotency-Key header is required: choose one key per payment intent and send it on every retry")
	}
	if len(values) > 1 {
		return "", chargeonce.Errorf(chargeonce.EINVALIDKEY, "send exactly one Idempotency-Key header")
	}
	v := trimOWS(values[0])
	if v == "" {
		return "", chargeonce.Errorf(chargeonce.EMISSINGKEY, "the Idempotency-Key header is empty")
	}
	if v[0] == '"' {
		k, err := parseSFString(v)
		if err != nil {
			return "", err
		}
		v = k
	}
	if len(v) == 0 {
		return "", chargeonce.Errorf(chargeonce.EINVALIDKEY, "the idempotency key is empty")
	}
	if len(v) > MaxKeyLen {
		return "", chargeonce.Errorf(chargeonce.EINVALIDKEY, "the idempotency key is %d bytes long; at most %d are allowed", len(v), MaxKeyLen)
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x21 || c > 0x7e {
			return "", chargeonce.Errorf(chargeonce.EINVALIDKEY, "the idempotency key may hold only visible ASCII characters (0x21-0x7E); byte %d is 0x%02X", i, c)
		}
	}
	return v, nil
}

// parseSFString decodes an RFC 8941 sf-string ("..." with \" and \\ escapes)
// that must make up the whole value: parameters are not accepted.
func parseSFString(v string) (string, error) {
	buf := make([]byte, 0, len(v))
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i >= len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", chargeonce.Errorf(chargeonce.EINVALIDKEY, "the quoted idempotency key has an invalid escape")
			}
			buf = append(buf, v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", chargeonce.Errorf(chargeonce.EINVALIDKEY, "unexpected characters after the quoted idempotency key")
			}
			return string(buf), nil
		case c < 0x20 || c > 0x7e:
			return "", chargeonce.Errorf(chargeonce.EINVALIDKEY, "the idempotency key may hold only visible ASCII characters (0x21-0x7E)")
		default:
			buf = append(buf, c)
		}
	}
	return "", chargeonce.Errorf(chargeonce.EINVALIDKEY, "the quoted idempotency key has no closing quote")
}

func trimOWS(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

// NewToken returns a random per-attempt token. The attempt that owns a
// record is the one whose token it carries; completing is a compare-and-set
// on it, so an attempt that lost its lease can never overwrite the winner.
func NewToken() string { return randomHex(16) }

// NewChargeID returns a new charge identifier, which is also the reference
// sent to the acquirer: 12 hex digits of the current Unix time in
// milliseconds, then 16 random hex digits. The time prefix makes ids of
// charges created one after another sort together, so the charges primary
// key grows at its end instead of writing to random pages of a large index
// (which the benchmark showed costs throughput once the table holds a
// million charges); the random part keeps ids unguessable and unique.
func NewChargeID() string { return newID("ch_") }

// NewRefundID returns a new refund identifier, shaped like a charge's
// (re_ then the same time prefix and random part), which is also the
// refund's reference at the acquirer.
func NewRefundID() string { return newID("re_") }

// NewOperationID returns a new identifier of a capture (cp_…) or a cancel
// (vd_…) of an authorization, which is also its reference at the acquirer.
func NewOperationID(kind chargeonce.RecordKind) string {
	if kind == chargeonce.KindCancel {
		return newID("vd_")
	}
	return newID("cp_")
}

func newID(prefix string) string {
	var b [3 + 12 + 16]byte
	copy(b[:], prefix)
	ms := uint64(time.Now().UnixMilli())
	const digits = "0123456789abcdef"
	for i := 14; i >= 3; i-- {
		b[i] = digits[ms&0xf]
		ms >>= 4
	}
	var r [8]byte
	_, _ = rand.Read(r[:])
	hex.Encode(b[15:], r[:])
	return string(b[:])
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b)
}

// KeyHashLen is how many hex digits of SHA-256(merchant, key) KeyHash
// gives: enough to follow one intent's attempts through the logs, never the
// key itself.
const KeyHashLen = 12

// KeyHash is how logs name an idempotency key (serve's request lines, the
// worker's warnings): the first KeyHashLen hex digits of SHA-256 over the
// merchant and the parsed key, so the bare and the quoted spelling of one
// key hash alike, and one key of two merchants (two intents) hashes apart.
// The key itself is never logged: it replays the intent's stored answer.
func KeyHash(merchant, key string) string {
	h := sha256.New()
	h.Write([]byte(merchant))
	h.Write([]byte{0})
	h.Write([]byte(key))
	return hex.EncodeToString(h.Sum(nil))[:KeyHashLen]
}
