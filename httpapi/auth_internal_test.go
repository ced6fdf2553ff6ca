package httpapi

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
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
		if m, ok := k.lookup(secret); !ok || m.ID != want {
			t.Errorf("lookup(%s) = %q, %v; want %q", secret, m.ID, ok, want)
		}
	}
	for _, wrong := range []string{"", "sk_live", "sk_live_plain ", "sha256:" + hex.EncodeToString(digest[:]), hex.EncodeToString(digest[:]), "# production keys"} {
		if m, ok := k.lookup(wrong); ok {
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
