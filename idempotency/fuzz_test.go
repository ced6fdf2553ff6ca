package idempotency

import (
	"reflect"
	"strings"
	"testing"

	"github.com/chargeonce/chargeonce"
)

// FuzzParseKey: whatever the header holds, ParseKey answers a key of 1 to
// MaxKeyLen visible ASCII characters or a missing/invalid-key error, never
// anything else; and a key it accepts means the same key sent bare or as a
// structured-field string.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{
		"abc-123", `"abc-123"`, "  abc-123\t", `"a\"b\\c"`, "", "   ", "a b", "clé", "a\x00b",
		`"abc`, `""`, `"abc";p=1`, `"abc" x`, `"a\qb"`, `"é"`, "\"\\", strings.Repeat("k", MaxKeyLen+1),
		"\xff", "%00", `"\"`, "\t\"x\"\t",
	} {
		f.Add(s, "")
		f.Add(s, "second")
	}
	f.Fuzz(func(t *testing.T, v, second string) {
		values := []string{v}
		if second != "" {
			values = append(values, second)
		}
		key, err := ParseKey(values)
		if err != nil {
			if code := chargeonce.ErrorCode(err); code != chargeonce.EMISSINGKEY && code != chargeonce.EINVALIDKEY {
				t.Fatalf("ParseKey(%q) error code %s (%v)", values, code, err)
			}
			if key != "" {
				t.Fatalf("ParseKey(%q) returned key %q with error %v", values, key, err)
			}
			return
		}
		if len(values) != 1 {
			t.Fatalf("ParseKey(%q) accepted several headers", values)
		}
		if len(key) == 0 || len(key) > MaxKeyLen {
			t.Fatalf("ParseKey(%q) = %q: length %d", v, key, len(key))
		}
		for i := 0; i < len(key); i++ {
			if c := key[i]; c < 0x21 || c > 0x7e {
				t.Fatalf("ParseKey(%q) = %q: byte %d is 0x%02X", v, key, i, c)
			}
		}
		// The same key, bare (when it does not look quoted) and quoted,
		// parses to itself.
		if key[0] != '"' {
			if again, err := ParseKey([]string{key}); err != nil || again != key {
				t.Fatalf("bare %q parses to %q, %v", key, again, err)
			}
		}
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
		if again, err := ParseKey([]string{quoted}); err != nil || again != key {
			t.Fatalf("quoted %s parses to %q, %v; want %q", quoted, again, err, key)
		}
	})
}

// metadata is the metadata of one entry k: v, none when k is "" (requests
// as Normalize leaves them: no empty maps).
func metadata(k, v string) map[string]string {
	if k == "" {
		return nil
	}
	return map[string]string{k: v}
}

// FuzzFingerprint: equal requests have equal fingerprints, and requests that
// differ in any field — including bytes moved across a field boundary —
// have different ones.
func FuzzFingerprint(f *testing.F) {
	f.Add(int64(1), int64(100), "BRL", "tok_ok", "", "", "", int64(1), int64(100), "BRL", "tok_ok", "", "", "")
	f.Add(int64(1), int64(100), "BRL", "tok_o", "k", "", "", int64(1), int64(100), "BRL", "tok_ok", "", "", "")
	f.Add(int64(12), int64(3), "BRL", "t", "", "", "", int64(1), int64(23), "BRL", "t", "", "", "")
	f.Add(int64(1), int64(100), "BRL", "1:a", "", "", "", int64(1), int64(100), "BRL", "1", ":a", "", "")
	f.Add(int64(-1), int64(0), "", "", "\x00", "", "", int64(-1), int64(0), "", "", "", "", "")
	f.Add(int64(1), int64(1), "US", "D", "x", "", "", int64(1), int64(1), "USD", "", "x", "", "")
	f.Add(int64(1), int64(1), "BRL", "t", "", "a", "b", int64(1), int64(1), "BRL", "t", "", "", "")
	f.Add(int64(1), int64(1), "BRL", "t", "", "a", "", int64(1), int64(1), "BRL", "t", "", "", "")
	f.Add(int64(1), int64(1), "BRL", "t", "x", "", "", int64(1), int64(1), "BRL", "t", "", "x", "")
	f.Fuzz(func(t *testing.T, o1, a1 int64, c1, p1, d1, k1, v1 string, o2, a2 int64, c2, p2, d2, k2, v2 string) {
		r1 := chargeonce.ChargeRequest{OrderID: o1, AmountCents: a1, Currency: c1, PaymentToken: p1, Description: d1, Metadata: metadata(k1, v1)}
		r2 := chargeonce.ChargeRequest{OrderID: o2, AmountCents: a2, Currency: c2, PaymentToken: p2, Description: d2, Metadata: metadata(k2, v2)}
		f1 := Fingerprint("POST", "/v1/charges", &r1)
		if again := r1; Fingerprint("POST", "/v1/charges", &again) != f1 {
			t.Fatalf("equal requests %+v have different fingerprints", r1)
		}
		if f2 := Fingerprint("POST", "/v1/charges", &r2); (f1 == f2) != reflect.DeepEqual(r1, r2) {
			t.Fatalf("requests %+v and %+v: equal=%v but fingerprints equal=%v", r1, r2, reflect.DeepEqual(r1, r2), f1 == f2)
		}
		if Fingerprint("PUT", "/v1/charges", &r1) == f1 || Fingerprint("POST", "/v1/charges/", &r1) == f1 {
			t.Fatalf("method or path not part of the fingerprint")
		}
	})
}
