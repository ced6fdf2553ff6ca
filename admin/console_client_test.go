package admin_test

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"testing"
)

// consoleClient is a signed-in console session: a cookie jar and the
// session's CSRF token.
type consoleClient struct {
	base string
	c    *http.Client
	csrf string
}

// console signs alice in to e's console.
func (e *env) console(t *testing.T) *consoleClient {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	cc := &consoleClient{base: e.admin.URL, c: &http.Client{Jar: jar}}
	cc.post(t, "/admin/login", url.Values{"key": {aliceKey}})
	m := regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`).FindStringSubmatch(cc.get(t, "/admin/"))
	if m == nil {
		t.Fatal("the signed-in console shows no CSRF token")
	}
	cc.csrf = m[1]
	return cc
}

// do sends a GET (form nil) or a POST of form (with the CSRF token), and
// returns the final page's status and body.
func (cc *consoleClient) do(t *testing.T, path string, form url.Values) (int, string) {
	t.Helper()
	var (
		resp *http.Response
		err  error
	)
	if form == nil {
		resp, err = cc.c.Get(cc.base + path)
	} else {
		if cc.csrf != "" {
			form.Set("csrf", cc.csrf)
		}
		resp, err = cc.c.PostForm(cc.base+path, form)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// get reads a page that must answer 200.
func (cc *consoleClient) get(t *testing.T, path string) string {
	t.Helper()
	st, b := cc.do(t, path, nil)
	if st != 200 {
		t.Fatalf("GET %s: %d %s", path, st, b)
	}
	return b
}

// post sends a form whose answer must be 200.
func (cc *consoleClient) post(t *testing.T, path string, form url.Values) string {
	t.Helper()
	st, b := cc.do(t, path, form)
	if st != 200 {
		t.Fatalf("POST %s: %d %s", path, st, b)
	}
	return b
}
