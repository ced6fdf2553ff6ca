package webhook_test

import (
	"bufio"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/webhook"
)

func TestRedactURL(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]string{
		"https://hooks.example.com/in":                        "https://hooks.example.com/in",
		"https://hooks.example.com/in?token=s3cr3t&x=1":       "https://hooks.example.com/in?token=REDACTED&x=REDACTED",
		"https://user:pa55@hooks.example.com/in":              "https://REDACTED@hooks.example.com/in",
		"https://hooks.example.com/in#frag-s3cr3t":            "https://hooks.example.com/in#REDACTED",
		"https://hooks.example.com/in?s3cr3t":                 "https://hooks.example.com/in?REDACTED",
		"http://127.0.0.1:9/hook?api_key=k-1234&sig=abc%2Fde": "http://127.0.0.1:9/hook?api_key=REDACTED&sig=REDACTED",
		"https://%zz": "(an unparsable URL)",
	} {
		if got := webhook.RedactURL(raw); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", raw, got, want)
		}
	}
}

// TestURLSecretsNeverLoggedOrStored: an endpoint whose URL holds a token in
// its query (and one with user info, stored before the API refused it)
// fails to deliver; neither the log (at every level) nor the stored
// attempt errors show the token. Seen before: the token at INFO on every
// failed delivery and in the attempt's error ('Post
// "http://127.0.0.1:…/hook?token=tok-s3cr3t": dial tcp …').
func TestURLSecretsNeverLoggedOrStored(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens: every delivery fails to connect
	secrets := []string{"tok-s3cr3t", "usr-s3cr3t", "pwd-s3cr3t"}
	f.endpoint(t, "demo", "http://"+addr+"/hook?token=tok-s3cr3t")
	f.endpoint(t, "demo", "http://usr-s3cr3t:pwd-s3cr3t@"+addr+"/hook")
	ch := f.settle(t, "demo", chargeonce.StatusCaptured)
	var logs apitest.Buffer
	s := webhook.NewSender(f.store, webhook.SenderOptions{AllowPrivate: true, Scale: 0.0002,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if n := s.RunOnce(t.Context()); n < 2 {
		t.Fatalf("RunOnce made %d deliveries, want 2 at least", n)
	}
	_, attempts, err := f.store.WebhookEventGet(t.Context(), "demo", "evt_"+ch.ID[3:])
	if err != nil || len(attempts) < 2 {
		t.Fatalf("attempts = %+v, %v", attempts, err)
	}
	for _, a := range attempts {
		if a.Error == "" {
			t.Fatalf("attempt %+v failed with no error", a)
		}
		for _, sec := range secrets {
			if strings.Contains(a.Error, sec) {
				t.Errorf("stored attempt error shows %q: %s", sec, a.Error)
			}
		}
	}
	if !strings.Contains(logs.String(), "delivery failed") {
		t.Fatalf("no failed delivery logged:\n%s", logs.String())
	}
	for _, sec := range secrets {
		if strings.Contains(logs.String(), sec) {
			t.Errorf("the log shows %q:\n%s", sec, logs.String())
		}
	}
	t.Logf("attempt errors: %q, %q", attempts[0].Error, attempts[1].Error)
}

// TestHugeResponseHeadersRefused: a receiver that answers 1 MiB of
// headers fails the delivery once 64 KiB are read, promptly.
func TestHugeResponseHeadersRefused(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = http.ReadRequest(bufio.NewReader(c))
				w := bufio.NewWriter(c)
				_, _ = w.WriteString("HTTP/1.1 200 OK\r\n")
				for i := range 1 << 14 {
					_, _ = w.WriteString("X-Pad-" + strings.Repeat("p", 40) + ": " + strings.Repeat("v", 20) + string(rune('a'+i%26)) + "\r\n")
				}
				_, _ = w.WriteString("Content-Length: 0\r\n\r\n")
				_ = w.Flush()
			}()
		}
	}()
	f.endpoint(t, "demo", "http://"+ln.Addr().String()+"/hook")
	ch := f.settle(t, "demo", chargeonce.StatusCaptured)
	s := f.sender(t, webhook.SenderOptions{})
	start := time.Now()
	if n := s.RunOnce(t.Context()); n < 1 {
		t.Fatalf("RunOnce made %d deliveries", n)
	}
	_, attempts, err := f.store.WebhookEventGet(t.Context(), "demo", "evt_"+ch.ID[3:])
	if err != nil || len(attempts) == 0 || attempts[0].StatusCode != 0 || !strings.Contains(attempts[0].Error, "header") {
		t.Fatalf("attempts = %+v, %v; want a failure for the headers' size", attempts, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the delivery took %s", d)
	}
}
