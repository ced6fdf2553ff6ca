package admin

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"strings"
)

// DemoKeys is the admin key serve runs with when --admin-addr is a loopback
// address and no --admin-keys-file is given: admin "operator", key
// ak_test_demo. cmd refuses it on any other address.
const DemoKeys = "operator:ak_test_demo"

// Keys maps admin keys to admins' names. Only SHA-256 digests are held,
// and a presented key is compared with every digest in constant time, as
// merchants' API keys are (httpapi.Keys).
type Keys struct {
	entries []keyEntry
}

type keyEntry struct {
	digest [sha256.Size]byte
	name   string
}

// ParseKeys parses admin keys, one "name:sha256:<64 hex digits>" (or
// "name:secret") per line; blank lines and # comments are ignored. Errors
// never repeat a secret.
func ParseKeys(spec string) (*Keys, error) {
	k := &Keys{}
	seen := map[[sha256.Size]byte]string{}
	for n, line := range strings.Split(spec, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, secret, ok := strings.Cut(line, ":")
		name, secret = strings.TrimSpace(name), strings.TrimSpace(secret)
		if !ok || name == "" || secret == "" {
			return nil, fmt.Errorf("line %d: an admin key is name:sha256:<hex> (or name:secret)", n+1)
		}
		if !visibleName(name) {
			return nil, fmt.Errorf("line %d: an admin's name is letters, digits and . _ - @ only", n+1)
		}
		var d [sha256.Size]byte
		if h, isDigest := strings.CutPrefix(secret, "sha256:"); isDigest {
			b, err := hex.DecodeString(h)
			if err != nil || len(b) != sha256.Size {
				return nil, fmt.Errorf("line %d (admin %q): a digest is sha256: followed by 64 hex digits (as printed by sha256sum)", n+1, name)
			}
			copy(d[:], b)
		} else {
			d = sha256.Sum256([]byte(secret))
		}
		if other, dup := seen[d]; dup {
			return nil, fmt.Errorf("line %d: admins %q and %q share a key", n+1, other, name)
		}
		seen[d] = name
		k.entries = append(k.entries, keyEntry{digest: d, name: name})
	}
	if len(k.entries) == 0 {
		return nil, fmt.Errorf("no admin keys given")
	}
	return k, nil
}

func visibleName(s string) bool {
	for _, c := range s {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("._-@", c)
		if !ok {
			return false
		}
	}
	return s != "" && len(s) <= 64
}

// Digests returns the keys' SHA-256 digests, so that serve can refuse an
// admin key that is also a merchant's API key.
func (k *Keys) Digests() [][sha256.Size]byte {
	out := make([][sha256.Size]byte, len(k.entries))
	for i, e := range k.entries {
		out[i] = e.digest
	}
	return out
}

// lookup returns the admin whose key is secret, comparing with every
// digest in constant time.
func (k *Keys) lookup(secret string) (string, bool) {
	d := sha256.Sum256([]byte(secret))
	found := -1
	for i := range k.entries {
		if subtle.ConstantTimeCompare(d[:], k.entries[i].digest[:]) == 1 {
			found = i // no break: every entry costs the same
		}
	}
	if found < 0 {
		return "", false
	}
	return k.entries[found].name, true
}
