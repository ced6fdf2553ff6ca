package admin

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"math"
	"strings"
	"sync"

	"github.com/chargeonce/chargeonce/internal/httpserve"
)

// DemoKeys is the admin key serve runs with when --admin-addr is a loopback
// address and no --admin-keys-file is given: admin "operator", key
// ak_test_demo (LoopbackDemoKeys). cmd refuses it on any other address.
const DemoKeys = "operator:ak_test_demo"

// Keys maps admin keys to admins' names. Only SHA-256 digests are held,
// and a presented key is found by its digest (see lookup).
type Keys struct {
	entries  []keyEntry
	byDigest map[[sha256.Size]byte]int
	// loopbackHosts: the keys are public (the demo's) and answer only
	// requests whose Host is a loopback name (httpserve.LoopbackHost).
	loopbackHosts bool
}

// LoopbackDemoKeys returns DemoKeys for a loopback --admin-addr. The key
// is public, so it answers only requests whose Host is localhost,
// 127.0.0.1 or [::1] (any port): a page on a DNS name rebound to
// 127.0.0.1 sends its own name, and the browser would let it read the
// answers.
func LoopbackDemoKeys() *Keys {
	k, err := ParseKeys(DemoKeys)
	if err != nil {
		panic(err) // DemoKeys parses
	}
	k.loopbackHosts = true
	return k
}

type keyEntry struct {
	digest [sha256.Size]byte
	name   string
	// bits estimates the key's entropy (0 when it is known to be tiny;
	// -1 when only its digest is known and nothing says it is weak).
	bits float64
}

// MinKeyBits is the least entropy an admin key must have: serve refuses
// weaker keys at start. `chargeonce admin-key new` makes 256-bit keys.
const MinKeyBits = 128

// ParseKeys parses admin keys, one "name:sha256:<64 hex digits>" (or
// "name:secret") per line; blank lines and # comments are ignored. Errors
// never repeat a secret.
func ParseKeys(spec string) (*Keys, error) {
	k := &Keys{byDigest: map[[sha256.Size]byte]int{}}
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
		bits := -1.0
		if h, isDigest := strings.CutPrefix(secret, "sha256:"); isDigest {
			b, err := hex.DecodeString(h)
			if err != nil || len(b) != sha256.Size {
				return nil, fmt.Errorf("line %d (admin %q): a digest is sha256: followed by 64 hex digits (as printed by sha256sum)", n+1, name)
			}
			copy(d[:], b)
			if tinyDigest(d) {
				bits = 0
			}
		} else {
			d = sha256.Sum256([]byte(secret))
			bits = EstimateBits(secret)
		}
		if other, dup := seen[d]; dup {
			return nil, fmt.Errorf("line %d: admins %q and %q share a key", n+1, other, name)
		}
		seen[d] = name
		k.byDigest[d] = len(k.entries)
		k.entries = append(k.entries, keyEntry{digest: d, name: name, bits: bits})
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

// Weak returns the admins whose key has less than MinKeyBits of entropy:
// a key given in clear, estimated from its length and alphabet, or a
// digest of a key of one or two characters. (A digest of another weak key
// cannot be told apart; `chargeonce admin-key new` makes strong ones.)
func (k *Keys) Weak() []string {
	var out []string
	for _, e := range k.entries {
		if e.bits >= 0 && e.bits < MinKeyBits {
			out = append(out, e.name)
		}
	}
	return out
}

// EstimateBits estimates a secret's entropy, in bits, as a guesser who
// knows its length and which kinds of characters it uses would count:
// length × log2(the alphabet those kinds make up), and no more than a
// secret of that many distinct characters could hold. It overestimates
// a word or a pattern, never a random key.
func EstimateBits(secret string) float64 {
	var lower, upper, digit, other bool
	distinct := map[rune]bool{}
	n := 0
	for _, c := range secret {
		n++
		distinct[c] = true
		switch {
		case c >= 'a' && c <= 'z':
			lower = true
		case c >= 'A' && c <= 'Z':
			upper = true
		case c >= '0' && c <= '9':
			digit = true
		default:
			other = true
		}
	}
	alphabet := 0
	for _, k := range []struct {
		used bool
		size int
	}{{lower, 26}, {upper, 26}, {digit, 10}, {other, 33}} {
		if k.used {
			alphabet += k.size
		}
	}
	if n == 0 {
		return 0
	}
	// A key of few distinct characters ("aaaa…", "abab…") is guessed from
	// that smaller alphabet.
	alphabet = min(alphabet, max(len(distinct)*2, 2))
	return float64(n) * math.Log2(float64(alphabet))
}

// tinyDigest reports whether d is the digest of a key of one or two
// printable ASCII characters.
func tinyDigest(d [sha256.Size]byte) bool {
	tinyOnce.Do(func() {
		tiny = map[[sha256.Size]byte]bool{}
		for a := byte(' '); a <= '~'; a++ {
			tiny[sha256.Sum256([]byte{a})] = true
			for b := byte(' '); b <= '~'; b++ {
				tiny[sha256.Sum256([]byte{a, b})] = true
			}
		}
	})
	return tiny[d]
}

var (
	tinyOnce sync.Once
	tiny     map[[sha256.Size]byte]bool
)

// NewKey returns a new admin key of 256 random bits, and the line that
// gives it to name in --admin-keys-file.
func NewKey(name string) (key, line string, err error) {
	if !visibleName(name) {
		return "", "", fmt.Errorf("an admin's name is letters, digits and . _ - @ only (at most 64)")
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", "", err
	}
	key = "ak_" + base64.RawURLEncoding.EncodeToString(b)
	d := sha256.Sum256([]byte(key))
	return key, name + ":sha256:" + hex.EncodeToString(d[:]), nil
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

// lookup returns the admin whose key is secret, for a request to host.
//
// The key is found by its SHA-256 digest in a map: one digest and one
// lookup whatever the number of admins, so that checking every key
// presented, wrong ones by the thousand included, costs little (0.2 µs;
// a key as long as a header may be, 8 KiB, 10-15 µs: httpapi's
// BenchmarkKeyLookup). The map's comparisons
// may stop at the first byte that differs, but what they could tell is how
// a digest of the guesser's choosing compares with an admin key's digest,
// which does not give back the key; and the map's hash is seeded per
// process.
func (k *Keys) lookup(secret, host string) (string, bool) {
	i, ok := k.byDigest[sha256.Sum256([]byte(secret))]
	if !ok || k.loopbackHosts && !httpserve.LoopbackHost(host) {
		return "", false
	}
	return k.entries[i].name, true
}
