package httpapi

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/internal/httpserve"
)

// DemoAPIKeys is what the server runs with when no key is configured: one
// merchant "demo" with the key sk_test_demo. cmd refuses it on a non-loopback
// address.
const DemoAPIKeys = "demo:sk_test_demo"

// digestPrefix marks a secret given as its SHA-256 digest
// (merchant:sha256:<64 hex digits>) instead of in clear.
const digestPrefix = "sha256:"

// Keys maps API keys to merchants. Only SHA-256 digests of the secrets are
// held, never the secrets, so configuration may hold digests too.
//
// A presented key is found by its digest in a map (see lookup): one digest
// and one lookup whatever the number of merchants, on every request and
// for every wrong key of a flood.
type Keys struct {
	entries  []keyEntry
	byDigest map[[sha256.Size]byte]int
	rates    map[string]engine.Rate
	// loopbackHosts: the keys are public (the demo's) and answer only
	// requests whose Host is a loopback name (httpserve.LoopbackHost).
	loopbackHosts bool
}

// LoopbackDemoKeys returns DemoAPIKeys for a loopback --addr. The key is
// public, so it answers only requests whose Host is localhost, 127.0.0.1
// or [::1] (any port): a page on a DNS name rebound to 127.0.0.1 sends its
// own name, and the browser would let it read the answers.
func LoopbackDemoKeys() *Keys {
	k, err := ParseKeys(DemoAPIKeys)
	if err != nil {
		panic(err) // DemoAPIKeys parses
	}
	k.loopbackHosts = true
	return k
}

type keyEntry struct {
	digest   [sha256.Size]byte
	merchant chargeonce.Merchant
}

// ParseKeys parses API keys: "merchant:secret" or
// "merchant:sha256:<64 hex digits>" pairs, separated by commas or newlines.
// Blank lines and lines starting with # are ignored, so the same syntax
// serves --api-keys and --api-keys-file. Errors never repeat a secret.
//
// An entry "rate <merchant> <rate> [burst <n>]" gives that merchant a rate
// of its own instead of --merchant-rate and --merchant-burst, as in
// "rate acme 200/s burst 400". The rate is attempts per s (the default
// unit), m or h; the burst defaults to twice the attempts per second (at
// least 1). The merchant must have a key.
func ParseKeys(spec string) (*Keys, error) {
	k := &Keys{byDigest: map[[sha256.Size]byte]int{}}
	seen := map[[sha256.Size]byte]string{}
	for n, line := range strings.Split(spec, "\n") {
		if t := strings.TrimSpace(line); t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		for _, pair := range strings.Split(line, ",") {
			pair = strings.TrimSpace(pair)
			if pair == "" {
				continue
			}
			lineNo := ""
			if strings.Contains(spec, "\n") {
				lineNo = fmt.Sprintf("line %d: ", n+1)
			}
			if fields := strings.Fields(pair); len(fields) > 1 && fields[0] == rateDirective {
				if err := k.parseRate(fields); err != nil {
					return nil, fmt.Errorf("%s%w", lineNo, err)
				}
				continue
			}
			where := lineNo + fmt.Sprintf("api key %q", redact(pair))
			merchant, secret, ok := strings.Cut(pair, ":")
			merchant, secret = strings.TrimSpace(merchant), strings.TrimSpace(secret)
			if !ok || merchant == "" || secret == "" {
				return nil, fmt.Errorf("%s is not merchant:secret or merchant:sha256:<hex>", where)
			}
			if !visibleASCII(merchant) {
				return nil, fmt.Errorf("%s: the merchant id must be visible ASCII characters", where)
			}
			var d [sha256.Size]byte
			if hexDigest, isDigest := strings.CutPrefix(secret, digestPrefix); isDigest {
				b, err := hex.DecodeString(hexDigest)
				if err != nil || len(b) != sha256.Size {
					return nil, fmt.Errorf("%s: a digest must be sha256: followed by 64 hex digits (as printed by sha256sum)", where)
				}
				copy(d[:], b)
			} else {
				d = sha256.Sum256([]byte(secret))
			}
			if m, dup := seen[d]; dup {
				if m != merchant {
					return nil, fmt.Errorf("the same api key is given to merchants %q and %q", m, merchant)
				}
				continue
			}
			seen[d] = merchant
			k.byDigest[d] = len(k.entries)
			k.entries = append(k.entries, keyEntry{digest: d, merchant: chargeonce.Merchant{ID: merchant}})
		}
	}
	if len(k.entries) == 0 {
		return nil, fmt.Errorf("no api keys given")
	}
	for m := range k.rates {
		if !k.hasMerchant(m) {
			return nil, fmt.Errorf("a rate is given for merchant %q, which has no api key", m)
		}
	}
	return k, nil
}

// rateDirective starts an entry that sets a merchant's own rate.
const rateDirective = "rate"

// parseRate reads "rate <merchant> <rate> [burst <n>]" into k.rates.
func (k *Keys) parseRate(fields []string) error {
	const form = `a rate entry is "rate <merchant> <attempts>/s [burst <n>]", as in "rate acme 200/s burst 400"`
	if len(fields) != 3 && (len(fields) != 5 || fields[3] != "burst") {
		return fmt.Errorf("%s; got %q", form, strings.Join(fields, " "))
	}
	merchant := fields[1]
	if !visibleASCII(merchant) || strings.Contains(merchant, ":") {
		return fmt.Errorf("%s: %q is not a merchant id", form, merchant)
	}
	perSecond, err := engine.ParsePerSecond(fields[2])
	if err != nil {
		return fmt.Errorf("merchant %q: %w", merchant, err)
	}
	burst := max(1, int(math.Min(math.Ceil(2*perSecond), math.MaxInt32)))
	if len(fields) == 5 {
		burst, err = strconv.Atoi(fields[4])
		if err != nil || burst < 1 {
			return fmt.Errorf("merchant %q: the burst must be a whole number of attempts, at least 1; got %q", merchant, fields[4])
		}
	}
	if k.rates == nil {
		k.rates = map[string]engine.Rate{}
	}
	if _, dup := k.rates[merchant]; dup {
		return fmt.Errorf("merchant %q is given two rates", merchant)
	}
	k.rates[merchant] = engine.Rate{PerSecond: perSecond, Burst: burst}
	return nil
}

func (k *Keys) hasMerchant(id string) bool {
	for _, e := range k.entries {
		if e.merchant.ID == id {
			return true
		}
	}
	return false
}

// HasDigest reports whether d is the SHA-256 digest of one of the keys:
// serve refuses an admin key that is also a merchant's, so that the two
// never cross.
func (k *Keys) HasDigest(d [sha256.Size]byte) bool {
	_, ok := k.byDigest[d]
	return ok
}

// Rates returns the rates the keys give merchants of their own, for
// engine.Options.MerchantRates; nil when there are none.
func (k *Keys) Rates() map[string]engine.Rate {
	return k.rates
}

// redact shows the merchant part of a merchant:secret pair only.
func redact(s string) string {
	if m, _, ok := strings.Cut(s, ":"); ok {
		return m + ":…"
	}
	return "…"
}

func visibleASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x21 || c > 0x7e {
			return false
		}
	}
	return s != ""
}

// lookup returns the merchant whose key is secret, for a request to host.
//
// The map's comparisons may stop at the first byte that differs, but what
// they could tell is how a digest of the client's choosing compares with a
// merchant's key's digest, which does not give back the key (and the map's
// hash is seeded per process). A scan comparing every digest in constant
// time, as this was, costs a compare per merchant on every request, right
// key or wrong: with 10,000 merchants about 300 µs a key, 0.2 µs by the
// map (BenchmarkKeyLookup; a wrong key as long as a header may be hashes
// in some 10-15 µs).
func (k *Keys) lookup(secret, host string) (chargeonce.Merchant, bool) {
	i, ok := k.byDigest[sha256.Sum256([]byte(secret))]
	if !ok || k.loopbackHosts && !httpserve.LoopbackHost(host) {
		return chargeonce.Merchant{}, false
	}
	return k.entries[i].merchant, true
}

// authenticate returns the merchant of the request's bearer key.
func (k *Keys) authenticate(r *http.Request) (chargeonce.Merchant, error) {
	h := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
		return chargeonce.Merchant{}, chargeonce.Errorf(chargeonce.EUNAUTHORIZED, "send your API key as Authorization: Bearer <api-key>")
	}
	m, ok := k.lookup(strings.TrimSpace(token), r.Host)
	if !ok {
		if k.loopbackHosts && !httpserve.LoopbackHost(r.Host) {
			return chargeonce.Merchant{}, chargeonce.Errorf(chargeonce.EUNAUTHORIZED, "the demo API key answers only requests to localhost, 127.0.0.1 or [::1]")
		}
		return chargeonce.Merchant{}, chargeonce.Errorf(chargeonce.EUNAUTHORIZED, "the API key is not valid")
	}
	noteMerchant(r, m.ID)
	return m, nil
}
