package httpapi

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"

	"github.com/chargeonce/chargeonce/engine"
)

func TestParseKeysFileSyntaxAndDigests(t *testing.T) {
	t.Parallel()
	digest := sha256.Sum256([]byte("sk_live_hashed"))
	upper := sha256.Sum256([]byte("sk_upper")) // digests may be upper-case hex
	spec := "# production keys\n" +
		"\n" +
		"  acme:sk_live_plain  \n" +
		"shop:sha256:" + hex.EncodeToString(digest[:]) + "\n" +
		"   # an indented comment\n" +
		"a:sk_a, b:sk_b\n" +
		"upper:sha256:" + strings.ToUpper(hex.EncodeToString(upper[:])) + "\n"
	k, err := ParseKeys(spec)
	if err != nil {
		t.Fatal(err)
	}
	for secret, want := range map[string]string{
		"sk_live_plain":  "acme",
		"sk_live_hashed": "shop",
		"sk_a":           "a",
		"sk_b":           "b",
		"sk_upper":       "upper",
	} {
		if m, ok := k.lookup(secret, "localhost"); !ok || m.ID != want {
			t.Errorf("lookup(%s) = %q, %v; want %q", secret, m.ID, ok, want)
		}
	}
	for _, wrong := range []string{"", "sk_live", "sk_live_plain ", "sha256:" + hex.EncodeToString(digest[:]), hex.EncodeToString(digest[:]), "# production keys"} {
		if m, ok := k.lookup(wrong, "localhost"); ok {
			t.Errorf("lookup(%q) found merchant %q", wrong, m.ID)
		}
	}
}

func TestParseKeysErrorsNeverShowTheSecret(t *testing.T) {
	t.Parallel()
	const secret = "sk_live_VERY_SECRET"
	for _, spec := range []string{
		"acme:sha256:" + secret,
		"acme:sha256:abcd",
		"acme:sha256:" + strings.Repeat("zz", 32),
		"acme:" + secret + "\nacme2:" + secret,
		"acme:" + secret + ",broken",
		"ac me:" + secret,
		"caf\xc3\xa9:" + secret,
		"# only a comment\n\n",
		"",
	} {
		_, err := ParseKeys(spec)
		if err == nil {
			t.Errorf("ParseKeys(%q) accepted it", spec)
			continue
		}
		if strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), "VERY") {
			t.Errorf("ParseKeys(%q) error shows the secret: %v", spec, err)
		}
	}
}

// TestParseKeysRates: a "rate" entry gives a merchant its own rate, beside
// its keys in either syntax; malformed entries, a rate for a merchant
// without a key and two rates for one merchant are refused.
func TestParseKeysRates(t *testing.T) {
	t.Parallel()
	digest := sha256.Sum256([]byte("sk_shop"))
	k, err := ParseKeys("acme:sk_acme\nshop:sha256:" + hex.EncodeToString(digest[:]) + "\nrate acme 200/s burst 400\n  rate   shop 60/m  \nrate:sk_rate, rate rate 5")
	if err != nil {
		t.Fatal(err)
	}
	for merchant, want := range map[string]engine.Rate{
		"acme": {PerSecond: 200, Burst: 400},
		"shop": {PerSecond: 1, Burst: 2},
		"rate": {PerSecond: 5, Burst: 10},
	} {
		if got := k.Rates()[merchant]; got != want {
			t.Errorf("rate of %s = %v, want %v", merchant, got, want)
		}
	}
	if m, ok := k.lookup("sk_rate", "localhost"); !ok || m.ID != "rate" {
		t.Errorf("the merchant named rate lost its key: %q %v", m.ID, ok)
	}
	for _, spec := range []string{
		"acme:sk_acme\nrate acme",
		"acme:sk_acme\nrate acme fast",
		"acme:sk_acme\nrate acme 0/s",
		"acme:sk_acme\nrate acme 10/d",
		"acme:sk_acme\nrate acme 10/s burst",
		"acme:sk_acme\nrate acme 10/s burst 0",
		"acme:sk_acme\nrate acme 10/s bursts 5",
		"acme:sk_acme\nrate shop 10/s",
		"acme:sk_acme\nrate acme 10/s\nrate acme 20/s",
	} {
		if _, err := ParseKeys(spec); err == nil {
			t.Errorf("ParseKeys(%q) accepted it", spec)
		}
	}
	if k, err := ParseKeys("acme:sk_acme"); err != nil || k.Rates() != nil {
		t.Errorf("keys without rate entries: rates %v, %v; want none", k.Rates(), err)
	}
}

// TestDemoKeysAnswerOnlyLoopbackHosts: LoopbackDemoKeys' key answers a
// loopback Host only (issue 48's item 5: DNS rebinding); keys parsed from
// configuration answer any.
func TestDemoKeysAnswerOnlyLoopbackHosts(t *testing.T) {
	t.Parallel()
	demo := LoopbackDemoKeys()
	for host, want := range map[string]bool{"localhost:8080": true, "127.0.0.1": true, "[::1]:8080": true, "rebind.attacker.example:8080": false, "": false} {
		if _, ok := demo.lookup("sk_test_demo", host); ok != want {
			t.Errorf("the demo key with Host %q: %v, want %v", host, ok, want)
		}
	}
	configured, err := ParseKeys(DemoAPIKeys)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := configured.lookup("sk_test_demo", "shop.example"); !ok {
		t.Error("a configured key was refused for its Host")
	}
}

// BenchmarkKeyLookup: the cost of checking a key, right or wrong, with
// few and with many merchants, and of a wrong key as long as a header may
// be (httpserve.MaxHeaderBytes).
func BenchmarkKeyLookup(b *testing.B) {
	for _, n := range []int{1, 100, 10000} {
		var spec strings.Builder
		for i := range n {
			fmt.Fprintf(&spec, "m%d:sk_live_%032d\n", i, i)
		}
		k, err := ParseKeys(spec.String())
		if err != nil {
			b.Fatal(err)
		}
		for name, key := range map[string]string{"right": fmt.Sprintf("sk_live_%032d", n-1), "wrong": "sk_live_wrong_0123456789abcdef01", "wrong-8KiB": strings.Repeat("x", 8<<10)} {
			b.Run(fmt.Sprintf("merchants=%d/%s", n, name), func(b *testing.B) {
				for b.Loop() {
					k.lookup(key, "localhost")
				}
			})
		}
	}
}
