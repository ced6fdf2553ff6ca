package webhook_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/chargeonce/chargeonce/webhook"
)

// TestCheckAddrClasses refuses one address of every forbidden class, and
// lets each through with allowPrivate.
func TestCheckAddrClasses(t *testing.T) {
	t.Parallel()
	forbidden := map[string][]string{
		"loopback":    {"127.0.0.1", "127.9.9.9", "::1", "::ffff:127.0.0.1"},
		"private":     {"10.1.2.3", "172.16.0.1", "172.31.255.255", "192.168.1.1", "fd00::1"},
		"link-local":  {"169.254.1.1", "fe80::1"},
		"multicast":   {"224.0.0.1", "239.1.2.3", "ff02::1", "ff05::2"},
		"metadata":    {"169.254.169.254"},
		"unspecified": {"0.0.0.0", "::"},
	}
	for class, addrs := range forbidden {
		for _, a := range addrs {
			ip := netip.MustParseAddr(a)
			err := webhook.CheckAddr(ip, false)
			if !errors.Is(err, webhook.ErrForbiddenAddress) {
				t.Errorf("%s address %s: got %v, want ErrForbiddenAddress", class, a, err)
			}
			if err != nil && !strings.Contains(err.Error(), class) {
				t.Errorf("%s refused as %v, want it named %s", a, err, class)
			}
			if err := webhook.CheckAddr(ip, true); err != nil {
				t.Errorf("%s address %s with allowPrivate: %v", class, a, err)
			}
		}
	}
	for _, a := range []string{"93.184.216.34", "8.8.8.8", "2606:4700:4700::1111", "172.32.0.1"} {
		if err := webhook.CheckAddr(netip.MustParseAddr(a), false); err != nil {
			t.Errorf("public address %s refused: %v", a, err)
		}
	}
}

func TestCheckURL(t *testing.T) {
	t.Parallel()
	bad := map[string]string{
		"http://example.com/hook":     "https",
		"ftp://example.com/":          "https",
		"/relative":                   "absolute",
		"https://user:pw@example.com": "user",
		"https://127.0.0.1/hook":      "loopback",
		"https://[::1]:8443/hook":     "loopback",
		"https://10.0.0.8/hook":       "private",
		"https://169.254.169.254/":    "metadata",
		"https://224.0.0.1/":          "multicast",
		"https://[fe80::1]/":          "link-local",
	}
	for u, want := range bad {
		err := webhook.CheckURL(u, false)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("CheckURL(%q) = %v, want an error about %s", u, err, want)
		}
	}
	for _, u := range []string{"https://example.com/hook", "https://hooks.example.com:8443/a?b=c"} {
		if err := webhook.CheckURL(u, false); err != nil {
			t.Errorf("CheckURL(%q) = %v", u, err)
		}
	}
	if err := webhook.CheckURL("http://127.0.0.1:9/hook", true); err != nil {
		t.Errorf("allowPrivate refuses http://127.0.0.1: %v", err)
	}
}

// TestDialerChecksAfterDNS connects by a name that resolves to loopback
// (localhost): the name passes CheckURL, the dialer refuses the address it
// resolved to, and with allowPrivate the same dial goes through.
func TestDialerChecksAfterDNS(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(204) }))
	t.Cleanup(srv.Close)
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	url := "http://localhost:" + port + "/"
	for _, allow := range []bool{false, true} {
		c := &http.Client{Transport: &http.Transport{DialContext: webhook.Dialer(allow).DialContext}}
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
		resp, err := c.Do(req)
		if resp != nil {
			resp.Body.Close()
		}
		switch {
		case !allow && !errors.Is(err, webhook.ErrForbiddenAddress):
			t.Errorf("dial of localhost without allowPrivate: %v, want ErrForbiddenAddress", err)
		case allow && err != nil:
			t.Errorf("dial of localhost with allowPrivate: %v", err)
		}
		c.CloseIdleConnections()
	}
}
