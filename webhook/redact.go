package webhook

import (
	"errors"
	"net/url"
	"strings"
)

// redacted replaces a secret in an endpoint URL.
const redacted = "REDACTED"

// RedactURL returns raw with what may be a secret replaced: the user name
// and password, every query value and the fragment. Receivers often take a
// token there (https://hooks.example.com/in?token=…); logs, stored attempt
// errors and operators' pages show the URL only this way. A URL that does
// not parse is shown as its scheme and host at most.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(an unparsable URL)"
	}
	if u.User != nil {
		u.User = url.User(redacted)
	}
	if u.RawQuery != "" {
		// Names are kept, values go; a bare name (?s3cr3t) may be the
		// secret itself, and goes too.
		parts := strings.Split(u.RawQuery, "&")
		for i, p := range parts {
			if name, _, ok := strings.Cut(p, "="); ok {
				parts[i] = name + "=" + redacted
			} else {
				parts[i] = redacted
			}
		}
		u.RawQuery = strings.Join(parts, "&")
		u.ForceQuery = false
	}
	if u.Fragment != "" || u.RawFragment != "" {
		u.Fragment, u.RawFragment = redacted, ""
	}
	if u.Opaque != "" {
		u.Opaque = redacted
	}
	return u.String()
}

// redactErr redacts the URL of the *url.Error in err's chain: Go's HTTP
// client names the URL it failed on, query included.
func redactErr(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		ue.URL = RedactURL(ue.URL)
	}
	return err
}

// scrub removes the secrets of endpoint URL raw from msg (an error's text),
// wherever and however they appear.
func scrub(msg, raw string) string {
	safe := RedactURL(raw)
	msg = strings.ReplaceAll(msg, raw, safe)
	if u, perr := url.Parse(raw); perr == nil {
		for _, secret := range []string{u.RawQuery, u.User.String(), u.Fragment, u.EscapedFragment()} {
			if len(secret) >= 3 {
				msg = strings.ReplaceAll(msg, secret, redacted)
			}
		}
		if p, ok := u.User.Password(); ok && len(p) >= 3 {
			msg = strings.ReplaceAll(msg, p, redacted)
		}
		if n := u.User.Username(); len(n) >= 3 {
			msg = strings.ReplaceAll(msg, n, redacted)
		}
	}
	return msg
}
