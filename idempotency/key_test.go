package idempotency

import (
	"strings"
	"testing"

	"github.com/chargeonce/chargeonce"
)

func TestParseKey(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("k", MaxKeyLen)
	for _, tc := range []struct {
		in   []string
		want string
		code string
	}{
		{[]string{"abc-123"}, "abc-123", ""},
		{[]string{`"abc-123"`}, "abc-123", ""},
		{[]string{"  abc-123\t"}, "abc-123", ""},
		{[]string{`"a\"b\\c"`}, `a"b\c`, ""},
		{[]string{long}, long, ""},
		{[]string{`"` + long + `"`}, long, ""},
		{[]string{"!~"}, "!~", ""},
		{nil, "", chargeonce.EMISSINGKEY},
		{[]string{""}, "", chargeonce.EMISSINGKEY},
		{[]string{"   "}, "", chargeonce.EMISSINGKEY},
		{[]string{"a", "b"}, "", chargeonce.EINVALIDKEY},
		{[]string{long + "k"}, "", chargeonce.EINVALIDKEY},
		{[]string{"a b"}, "", chargeonce.EINVALIDKEY},
		{[]string{"clé"}, "", chargeonce.EINVALIDKEY},
		{[]string{"a\x00b"}, "", chargeonce.EINVALIDKEY},
		{[]string{"a\x7fb"}, "", chargeonce.EINVALIDKEY},
		{[]string{`"abc`}, "", chargeonce.EINVALIDKEY},
		{[]string{`""`}, "", chargeonce.EINVALIDKEY},
		{[]string{`"a b"`}, "", chargeonce.EINVALIDKEY},
		{[]string{`"abc";p=1`}, "", chargeonce.EINVALIDKEY},
		{[]string{`"abc" x`}, "", chargeonce.EINVALIDKEY},
		{[]string{`"a\nb"`}, "", chargeonce.EINVALIDKEY},
		{[]string{`"a\qb"`}, "", chargeonce.EINVALIDKEY},
		{[]string{`"é"`}, "", chargeonce.EINVALIDKEY},
	} {
		got, err := ParseKey(tc.in)
		if tc.code == "" {
			if err != nil || got != tc.want {
				t.Errorf("ParseKey(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
			}
			continue
		}
		if code := chargeonce.ErrorCode(err); code != tc.code {
			t.Errorf("ParseKey(%q) error code = %q (%v), want %q", tc.in, code, err, tc.code)
		}
	}
}

func TestFingerprint(t *testing.T) {
	t.Parallel()
	base := chargeonce.ChargeRequest{OrderID: 1, AmountCents: 100, Currency: "BRL", PaymentToken: "tok_ok"}
	fp := Fingerprint("POST", "/v1/charges", &base)
	same := base
	if Fingerprint("POST", "/v1/charges", &same) != fp {
		t.Fatal("equal requests have different fingerprints")
	}
	for name, mod := range map[string]func(r *chargeonce.ChargeRequest){
		"order":       func(r *chargeonce.ChargeRequest) { r.OrderID = 2 },
		"amount":      func(r *chargeonce.ChargeRequest) { r.AmountCents = 101 },
		"currency":    func(r *chargeonce.ChargeRequest) { r.Currency = "USD" },
		"token":       func(r *chargeonce.ChargeRequest) { r.PaymentToken = "tok_declined" },
		"description": func(r *chargeonce.ChargeRequest) { r.Description = "x" },
		// Length prefixes keep field boundaries: moving bytes between two
		// adjacent strings changes the fingerprint.
		"boundary": func(r *chargeonce.ChargeRequest) { r.PaymentToken = "tok_o"; r.Description = "k" },
		"metadata": func(r *chargeonce.ChargeRequest) { r.Metadata = map[string]string{"a": "b"} },
		"metadata moved into the description": func(r *chargeonce.ChargeRequest) {
			r.Description = "\x00metadata11:a1:b"
		},
	} {
		r := base
		mod(&r)
		if Fingerprint("POST", "/v1/charges", &r) == fp {
			t.Errorf("changing %s kept the fingerprint", name)
		}
	}
	m1 := base
	m1.Metadata = map[string]string{"a": "1", "b": "2"}
	m2 := base
	m2.Metadata = map[string]string{"b": "2", "a": "1"}
	m3 := base
	m3.Metadata = map[string]string{"a": "1", "b": "3"}
	if Fingerprint("POST", "/v1/charges", &m1) != Fingerprint("POST", "/v1/charges", &m2) {
		t.Error("equal metadata have different fingerprints")
	}
	if Fingerprint("POST", "/v1/charges", &m1) == Fingerprint("POST", "/v1/charges", &m3) {
		t.Error("changing a metadata value kept the fingerprint")
	}
	if Fingerprint("PUT", "/v1/charges", &base) == fp {
		t.Error("the method is not part of the fingerprint")
	}
}

// TestFingerprintWithoutMetadataUnchanged: a request without metadata has
// the fingerprint it had before metadata existed (the value below was
// computed by the code of that time), so records stored then still
// recognise their retries instead of answering 422.
func TestFingerprintWithoutMetadataUnchanged(t *testing.T) {
	t.Parallel()
	r := chargeonce.ChargeRequest{OrderID: 123, AmountCents: 25000, Currency: "BRL", PaymentToken: "tok_ok", Description: "order 123"}
	const want = "naoi88EOMYRgMRils4fs3fgNKqrsVwo104u3YyUMxCc"
	if got := Fingerprint("POST", "/v1/charges", &r); got != want {
		t.Fatalf("fingerprint = %s, want %s", got, want)
	}
	r.Metadata = map[string]string{}
	if got := Fingerprint("POST", "/v1/charges", &r); got != want {
		t.Fatalf("with empty metadata: fingerprint = %s, want %s", got, want)
	}
}

func BenchmarkParseKey(b *testing.B) {
	v := []string{`"9f1c2e4a-7d3b-4c5e-8f6a-1b2c3d4e5f60"`}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseKey(v); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkFingerprint(b *testing.B) {
	r := chargeonce.ChargeRequest{OrderID: 123, AmountCents: 25000, Currency: "BRL", PaymentToken: "tok_ok", Description: "order 123"}
	b.ReportAllocs()
	for b.Loop() {
		Fingerprint("POST", "/v1/charges", &r)
	}
}

func TestNewChargeIDSortsByTime(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	prev := NewChargeID()
	for i := 0; i < 2000; i++ {
		id := NewChargeID()
		if len(id) != 31 || !strings.HasPrefix(id, "ch_") {
			t.Fatalf("id %q has the wrong shape", id)
		}
		if seen[id] {
			t.Fatalf("id %q made twice", id)
		}
		seen[id] = true
		if id[:15] < prev[:15] {
			t.Fatalf("id %q sorts before the earlier %q", id, prev)
		}
		prev = id
	}
}
