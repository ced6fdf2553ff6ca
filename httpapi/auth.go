package httpapi

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/engine"
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
// Authentication compares the digest of the presented key with every
// configured digest using crypto/subtle, without stopping at the first
// match, so its timing depends neither on which digest matched nor on how
// many leading bytes of any digest agree. (A map keyed by digest, as this
// used before, was already hard to exploit — its early-exit comparison could
// at most leak bytes of a digest, and a digest does not give back a secret
// — but a scan over the few keys a service has costs well under a
// microsecond and needs no such argument.)
type Keys struct {
	entries []keyEntry
	rates   map[string]engine.Rate
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
	k := &Keys{}
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
	for _, e := range k.entries {
		if e.digest == d {
			return true
		}
	}
	return false
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

// lookup returns the merchant whose digest equals the digest of secret,
// comparing against every configured digest in constant time.
func (k *Keys) lookup(secret string) (chargeonce.Merchant, bool) {
	d := sha256.Sum256([]byte(secret))
	found := -1
	for i := range k.entries {
		if subtle.ConstantTimeCompare(d[:], k.entries[i].digest[:]) == 1 {
			found = i // no break: every entry costs the same
		}
	}
	if found < 0 {
		return chargeonce.Merchant{}, false
	}
	return k.entries[found].merchant, true
}

// authenticate returns the merchant of the request's bearer key.
func (k *Keys) authenticate(r *http.Request) (chargeonce.Merchant, error) {
	h := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
		return chargeonce.Merchant{}, chargeonce.Errorf(chargeonce.EUNAUTHORIZED, "send your API key as Authorization: Bearer <api-key>")
	}
	m, ok := k.lookup(strings.TrimSpace(token))
	if !ok {
		return chargeonce.Merchant{}, chargeonce.Errorf(chargeonce.EUNAUTHORIZED, "the API key is not valid")
	}
	noteMerchant(r, m.ID)
	return m, nil
}
