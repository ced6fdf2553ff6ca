package httpapi

import (
	"crypto/sha256"
	"fmt"
	"net/http"
	"strings"

	"github.com/chargeonce/chargeonce"
)

// DemoAPIKeys is what the server runs with when no key is configured: one
// merchant "demo" with the key sk_test_demo. cmd refuses it on a non-loopback
// address.
const DemoAPIKeys = "demo:sk_test_demo"

// Keys maps API keys to merchants. Secrets are held as SHA-256 digests, so
// a lookup's timing tells nothing useful about a secret.
type Keys struct {
	byDigest map[[32]byte]chargeonce.Merchant
}

// ParseKeys parses "merchant:secret" pairs separated by commas.
func ParseKeys(spec string) (*Keys, error) {
	k := &Keys{byDigest: map[[32]byte]chargeonce.Merchant{}}
	for _, pair := range strings.Split(spec, ",") {
		pair = strings.TrimSpace(pair)
		if pair == "" {
			continue
		}
		merchant, secret, ok := strings.Cut(pair, ":")
		merchant, secret = strings.TrimSpace(merchant), strings.TrimSpace(secret)
		if !ok || merchant == "" || secret == "" {
			return nil, fmt.Errorf("api key %q is not merchant:secret", redact(pair))
		}
		d := sha256.Sum256([]byte(secret))
		if m, dup := k.byDigest[d]; dup && m.ID != merchant {
			return nil, fmt.Errorf("the same api key is given to merchants %q and %q", m.ID, merchant)
		}
		k.byDigest[d] = chargeonce.Merchant{ID: merchant}
	}
	if len(k.byDigest) == 0 {
		return nil, fmt.Errorf("no api keys in %q", redact(spec))
	}
	return k, nil
}

func redact(s string) string {
	if m, _, ok := strings.Cut(s, ":"); ok {
		return m + ":…"
	}
	return "…"
}

// authenticate returns the merchant of the request's bearer key.
func (k *Keys) authenticate(r *http.Request) (chargeonce.Merchant, error) {
	h := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
		return chargeonce.Merchant{}, chargeonce.Errorf(chargeonce.EUNAUTHORIZED, "send your API key as Authorization: Bearer <api-key>")
	}
	m, ok := k.byDigest[sha256.Sum256([]byte(strings.TrimSpace(token)))]
	if !ok {
		return chargeonce.Merchant{}, chargeonce.Errorf(chargeonce.EUNAUTHORIZED, "the API key is not valid")
	}
	noteMerchant(r, m.ID)
	return m, nil
}
