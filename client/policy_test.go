package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/client"
)

const capturedBody = `{"id":"ch_1","order_id":7,"amount_cents":100,"currency":"BRL","status":"captured","decline_code":null,"created_at":"2026-12-02T10:00:00Z"}`

// scripted starts a tiny server that answers the n-th request (from 1)
// with answer(n), and counts the requests.
func scripted(t *testing.T, answer func(n int64, w http.ResponseWriter)) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var count atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		answer(count.Add(1), w)
	}))
	t.Cleanup(srv.Close)
	return srv, &count
}

func problemAnswer(w http.ResponseWriter, status int, slug string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"type":"https://chargeonce.dev/problems/%s","title":"t","status":%d,"detail":"d","charge_id":"ch_1","decline_code":"insufficient_funds"}`, slug, status)
}

// Every status of the retry policy, one by one: the retried ones are
// followed by a 201, the final ones end the call after one attempt with the
// right error type.
func TestRetryPolicyByStatus(t *testing.T) {
	t.Parallel()
	retried := []int{202, 408, 409, 429, 500, 502, 503, 504}
	for _, status := range retried {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			t.Parallel()
			srv, count := scripted(t, func(n int64, w http.ResponseWriter) {
				if n == 1 {
					if status == 202 {
						w.WriteHeader(202)
						fmt.Fprint(w, `{"id":"ch_1","status":"processing"}`)
						return
					}
					problemAnswer(w, status, "whatever")
					return
				}
				w.WriteHeader(201)
				fmt.Fprint(w, capturedBody)
			})
			c := newClient(t, srv.URL)
			ch, err := c.CreateCharge(context.Background(), charge(7, "tok_ok"))
			if err != nil || ch.Attempts != 2 || count.Load() != 2 || ch.Status != client.StatusCaptured {
				t.Fatalf("after a %d: %+v, %v, %d requests; want captured on attempt 2", status, ch, err, count.Load())
			}
		})
	}

	final := []struct {
		status int
		slug   string
		check  func(error) bool
	}{
		{400, "validation-failed", func(err error) bool { var e *client.ValidationError; return errors.As(err, &e) }},
		{401, "unauthorized", func(err error) bool { var e *client.UnauthorizedError; return errors.As(err, &e) }},
		{402, "card-declined", func(err error) bool {
			var e *client.DeclinedError
			return errors.As(err, &e) && e.ChargeID == "ch_1" && e.DeclineCode == "insufficient_funds"
		}},
		{404, "not-found", func(err error) bool { var e *client.APIError; return errors.As(err, &e) && e.Slug() == "not-found" }},
		{413, "payload-too-large", func(err error) bool { var e *client.ValidationError; return errors.As(err, &e) }},
		{422, "idempotency-key-reused", func(err error) bool { var e *client.KeyReusedError; return errors.As(err, &e) }},
	}
	for _, tc := range final {
		t.Run(fmt.Sprint(tc.status), func(t *testing.T) {
			t.Parallel()
			srv, count := scripted(t, func(_ int64, w http.ResponseWriter) { problemAnswer(w, tc.status, tc.slug) })
			c := newClient(t, srv.URL)
			_, err := c.CreateCharge(context.Background(), charge(7, "tok_ok"))
			if !tc.check(err) || client.Attempts(err) != 1 || count.Load() != 1 {
				t.Fatalf("after a %d: %v (%T), %d requests; want a typed error after 1 attempt", tc.status, err, err, count.Load())
			}
			var ae *client.APIError
			if !errors.As(err, &ae) || ae.StatusCode != tc.status || ae.Slug() != tc.slug || ae.Problem.Detail != "d" {
				t.Fatalf("problem details not kept: %+v", ae)
			}
		})
	}
}

// Out of attempts: the error says so, and carries the last answer.
func TestMaxAttempts(t *testing.T) {
	t.Parallel()
	srv, count := scripted(t, func(_ int64, w http.ResponseWriter) {
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(502)
		fmt.Fprint(w, "<html>bad gateway</html>")
	})
	c := newClient(t, srv.URL, client.WithMaxAttempts(3))
	_, err := c.CreateCharge(context.Background(), charge(7, "tok_ok"))
	var gu *client.GaveUpError
	var ae *client.APIError
	if !errors.Is(err, client.ErrAttemptsExhausted) || !errors.As(err, &gu) || !errors.As(err, &ae) {
		t.Fatalf("err = %v, want a GaveUpError for exhausted attempts with the 502", err)
	}
	if gu.Attempts() != 3 || count.Load() != 3 || ae.StatusCode != 502 || ae.Problem.Detail != "<html>bad gateway</html>" {
		t.Fatalf("attempts %d, requests %d, last %+v", gu.Attempts(), count.Load(), ae)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatal("running out of attempts is not a deadline")
	}
}

// A 429 with Retry-After is waited out, like a 409.
func TestTooManyRequestsHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	var first, gap atomic.Int64
	srv, _ := scripted(t, func(n int64, w http.ResponseWriter) {
		if n == 1 {
			first.Store(time.Now().UnixNano())
			w.Header().Set("Retry-After", "1")
			problemAnswer(w, 429, "too-many-requests")
			return
		}
		gap.Store(time.Now().UnixNano() - first.Load())
		w.WriteHeader(201)
		fmt.Fprint(w, capturedBody)
	})
	c := newClient(t, srv.URL)
	ch, err := c.CreateCharge(context.Background(), charge(7, "tok_ok"))
	if err != nil || ch.Attempts != 2 {
		t.Fatalf("%+v, %v", ch, err)
	}
	if d := time.Duration(gap.Load()); d < time.Second {
		t.Fatalf("retried %s after a 429 with Retry-After: 1", d)
	}
}

// A context cancelled during the wait between attempts ends the call at
// once with context.Canceled and the last answer.
func TestCancelDuringBackoff(t *testing.T) {
	t.Parallel()
	srv, _ := scripted(t, func(_ int64, w http.ResponseWriter) {
		w.Header().Set("Retry-After", "30")
		problemAnswer(w, 409, "request-in-progress")
	})
	c := newClient(t, srv.URL)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	_, err := c.CreateCharge(ctx, charge(7, "tok_ok"))
	var ae *client.APIError
	if !errors.Is(err, context.Canceled) || !errors.As(err, &ae) || ae.StatusCode != 409 || client.Attempts(err) != 1 {
		t.Fatalf("err = %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("returned %s after the cancel", d)
	}
}

// Connection refused is retried, and a bad base URL is reported without a
// request.
func TestConnectionErrorsAndBadConfig(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close() // nothing listens there any more
	c := newClient(t, url, client.WithMaxAttempts(3))
	_, err := c.CreateCharge(context.Background(), charge(7, "tok_ok"))
	if !errors.Is(err, client.ErrAttemptsExhausted) || client.Attempts(err) != 3 {
		t.Fatalf("err = %v, want 3 attempts at a closed port", err)
	}

	for _, base := range []string{"127.0.0.1:8080", "ftp://x", "http://%zz"} {
		_, err := client.New(base, "k").GetCharge(context.Background(), "ch_1")
		if err == nil || client.Attempts(err) != 0 {
			t.Fatalf("base %q: err = %v, want a configuration error", base, err)
		}
	}
	_, err = client.New("http://127.0.0.1:1", "bad\nkey").GetCharge(context.Background(), "ch_1")
	if err == nil || client.Attempts(err) != 0 {
		t.Fatalf("an API key with a newline: %v", err)
	}
}
