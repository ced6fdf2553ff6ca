package httpapi

import (
	"unicode/utf8"

	"github.com/chargeonce/chargeonce"
)

// checkText enforces SPEC "POST /v1/charges": the body is valid UTF-8 and no
// string holds U+0000 or a lone surrogate escape. It must look at the raw
// bytes: encoding/json silently replaces invalid UTF-8 and lone surrogate
// escapes ("\ud800") with U+FFFD, so after decoding such a request would be
// charged with a description the client never sent; and "\u0000" decodes to
// a NUL byte that PostgreSQL's text refuses while SQLite keeps it.
//
// The error names the top-level field whose value holds the bad text (none
// when the bad text is in a field name or outside any string). Malformed
// JSON is left to the decoder: checkText only judges the strings it finds.
func checkText(body []byte) error {
	depth := 0       // nesting of objects and arrays
	field := ""      // the top-level field whose value is being read
	keyNext := false // at depth 1, the next string is a field name
	for i := 0; i < len(body); i++ {
		switch c := body[i]; c {
		case '{':
			depth++
			if depth == 1 {
				keyNext = true
			}
		case '[':
			depth++
		case '}', ']':
			depth--
			if depth < 1 {
				field = ""
			}
		case ',':
			if depth == 1 {
				keyNext = true
				field = ""
			}
		case '"':
			end, name, problem := scanString(body, i+1)
			isKey := depth == 1 && keyNext
			if problem != "" {
				if isKey || depth < 1 || field == "" {
					return chargeonce.Errorf(chargeonce.EINVALID, "a string in the body %s (at byte %d)", problem, end)
				}
				return chargeonce.FieldError(field, "%s %s (at byte %d of the body)", field, problem, end)
			}
			if isKey {
				field, keyNext = name, false
			}
			i = end
		default:
			if c >= utf8.RuneSelf {
				r, size := utf8.DecodeRune(body[i:])
				if r == utf8.RuneError && size <= 1 {
					return chargeonce.Errorf(chargeonce.EINVALID, "the body must be valid UTF-8; byte %d is not", i)
				}
				i += size - 1
			}
		}
	}
	return nil
}

// scanString reads the JSON string whose content starts at body[start] and
// returns the index of its closing quote (len(body) when it has none), its
// content when it is a plain field name (no escapes), and what is wrong with
// it, if anything.
func scanString(body []byte, start int) (end int, plain string, problem string) {
	escaped := false
	for i := start; i < len(body); {
		c := body[i]
		switch {
		case c == '"':
			if !escaped {
				plain = string(body[start:i])
			}
			return i, plain, ""
		case c == 0:
			return i, "", "must not contain U+0000"
		case c == '\\':
			escaped = true
			if i+1 >= len(body) {
				return len(body), "", ""
			}
			if body[i+1] != 'u' {
				i += 2
				continue
			}
			r, ok := hex4(body, i+2)
			if !ok {
				i += 2 // malformed escape: the decoder reports it
				continue
			}
			switch {
			case r == 0:
				return i, "", "must not contain U+0000 (\\u0000)"
			case r >= 0xDC00 && r <= 0xDFFF:
				return i, "", "must not contain a lone surrogate escape (a low surrogate \\u" + string(body[i+2:i+6]) + " without a high one before it)"
			case r >= 0xD800 && r <= 0xDBFF:
				if i+7 < len(body) && body[i+6] == '\\' && body[i+7] == 'u' {
					if lo, ok := hex4(body, i+8); ok && lo >= 0xDC00 && lo <= 0xDFFF {
						i += 12 // a valid surrogate pair
						continue
					}
				}
				return i, "", "must not contain a lone surrogate escape (a high surrogate \\u" + string(body[i+2:i+6]) + " not followed by a low one)"
			}
			i += 6
		case c < utf8.RuneSelf:
			i++
		default:
			r, size := utf8.DecodeRune(body[i:])
			if r == utf8.RuneError && size <= 1 {
				return i, "", "must be valid UTF-8"
			}
			i += size
		}
	}
	return len(body), "", ""
}

// hex4 decodes the four hex digits at body[i:i+4].
func hex4(body []byte, i int) (rune, bool) {
	if i+4 > len(body) {
		return 0, false
	}
	var r rune
	for _, c := range body[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// maxChargeIDLen bounds the ids GET /v1/charges/{id} looks up; ours are 31
// bytes long.
const maxChargeIDLen = 255

// plausibleChargeID reports whether id could name a charge: 1 to
// maxChargeIDLen visible ASCII characters, like every id the service makes.
func plausibleChargeID(id string) bool {
	if id == "" || len(id) > maxChargeIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c < 0x21 || c > 0x7e {
			return false
		}
	}
	return true
}
