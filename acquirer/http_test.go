package acquirer_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
)

const httpSlow = 80 * time.Millisecond

// setupHTTP serves a fresh simulator on a loopback httptest server and
// returns it with a Client for it. The server closes (waiting for its
// handlers and dropping idle connections) before the simulator does.
func setupHTTP(t *testing.T, opts acquirer.Options) (*acquirer.Simulator, *acquirer.Client, *httptest.Server) {
	t.Helper()
	if opts.Slow == 0 {
		opts.Slow = httpSlow
	}
	sim := acquirer.NewSimulator(opts)
	t.Cleanup(func() { _ = sim.Close() })
	srv := httptest.NewServer(acquirer.Handler(sim))
	t.Cleanup(srv.Close)
	return sim, acquirer.NewClient(srv.URL+"/", srv.Client()), srv
}

func req(ref, token string) chargeonce.CaptureRequest {
	return chargeonce.CaptureRequest{
		Reference: ref, OrderID: 7, Merchant: "m1",
		AmountCents: 1990, Currency: "BRL", PaymentToken: token,
	}
}

func TestHTTPCaptureEndToEnd(t *testing.T) {
	t.Parallel()
	sim, client, _ := setupHTTP(t, acquirer.Options{})
	ctx := t.Context()

	res, err := client.Capture(ctx, req("ch_ok", acquirer.TokenOK))
	want := chargeonce.CaptureResult{Reference: "ch_ok", Status: chargeonce.StatusCaptured}
	if err != nil || res != want {
		t.Fatalf("Capture = %+v, %v; want %+v", res, err, want)
	}
	res, err = client.Capture(ctx, req("ch_declined", acquirer.TokenDeclined))
	want = chargeonce.CaptureResult{Reference: "ch_declined", Status: chargeonce.StatusDeclined, DeclineCode: acquirer.DeclineInsufficientFunds}
	if err != nil || res != want {
		t.Fatalf("Capture = %+v, %v; want %+v", res, err, want)
	}
	// A repeat over HTTP is a duplicate, too.
	if res, err := client.Capture(ctx, req("ch_ok", acquirer.TokenOK)); err != nil || res.Status != chargeonce.StatusCaptured {
		t.Fatalf("repeat = %+v, %v", res, err)
	}

	c, found, err := client.Get(ctx, "ch_ok")
	if err != nil || !found || c.Status != chargeonce.StatusCaptured || c.AmountCents != 1990 || c.OrderID != 7 {
		t.Fatalf("Get(ch_ok) = %+v, %v, %v", c, found, err)
	}
	if simC, _ := sim.Get("ch_ok"); !simC.CreatedAt.Equal(c.CreatedAt) {
		t.Fatalf("Get over HTTP created_at %s, in process %s", c.CreatedAt, simC.CreatedAt)
	}
	if _, found, err := client.Get(ctx, "ch_never_seen"); err != nil || found {
		t.Fatalf("Get(ch_never_seen) = found %v, %v; want not found", found, err)
	}

	list, err := client.ListByOrder(ctx, 7, "m1")
	if err != nil || len(list) != 2 || list[0].Reference != "ch_ok" || list[1].DeclineCode != acquirer.DeclineInsufficientFunds {
		t.Fatalf("ListByOrder = %+v, %v", list, err)
	}
	if list, err := client.ListByOrder(ctx, 7, "m2"); err != nil || len(list) != 0 {
		t.Fatalf("ListByOrder of another merchant = %+v, %v; want none", list, err)
	}

	st, err := client.Stats(ctx)
	wantSt := acquirer.Stats{CaptureRequests: 3, Captures: 1, DuplicateRequests: 1}
	if err != nil || st != wantSt || st != sim.Stats() {
		t.Fatalf("Stats = %+v, %v; want %+v", st, err, wantSt)
	}
}

func TestHTTPFaultsAreErrors(t *testing.T) {
	t.Parallel()
	for _, token := range []string{acquirer.TokenFailBefore, acquirer.TokenFailAfter} {
		t.Run(token, func(t *testing.T) {
			t.Parallel()
			sim, client, _ := setupHTTP(t, acquirer.Options{})
			ref := "ch_" + token

			_, err := client.Capture(t.Context(), req(ref, token))
			var se *acquirer.StatusError
			if !errors.As(err, &se) || se.StatusCode != http.StatusServiceUnavailable || !errors.Is(err, acquirer.ErrUnavailable) {
				t.Fatalf("first Capture error = %v, want a 503 StatusError matching ErrUnavailable", err)
			}
			if !strings.HasSuffix(se.Problem.Type, "/unavailable") || !strings.Contains(se.Problem.Detail, token) {
				t.Fatalf("problem = %+v", se.Problem)
			}
			_, capturedFirst := sim.Get(ref)
			if capturedFirst != (token == acquirer.TokenFailAfter) {
				t.Fatalf("after the first %s request, captured = %v", token, capturedFirst)
			}

			res, err := client.Capture(t.Context(), req(ref, token))
			if err != nil || res.Status != chargeonce.StatusCaptured {
				t.Fatalf("retry = %+v, %v; want captured", res, err)
			}
			if n := sim.CapturedCount("m1", 7); n != 1 {
				t.Fatalf("CapturedCount = %d, want 1", n)
			}
		})
	}
}

// TestHTTPTimeoutIsUnknownAndCaptureCompletes: the client gives up on a slow
// capture, which still settles; retrying with the same reference finds it.
func TestHTTPTimeoutIsUnknownAndCaptureCompletes(t *testing.T) {
	t.Parallel()
	// The client gives up after half a second, long enough for its request
	// to reach the simulator on a loaded machine (the point is a capture
	// that goes on after the client gave up), and the capture takes twice
	// that.
	const giveUp = 500 * time.Millisecond
	sim, client, _ := setupHTTP(t, acquirer.Options{Slow: 2 * giveUp})
	ctx, cancel := context.WithTimeout(t.Context(), giveUp)
	defer cancel()
	if _, err := client.Capture(ctx, req("ch_slow", acquirer.TokenSlow)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Capture error = %v, want context.DeadlineExceeded", err)
	}
	sim.Wait()
	res, err := client.Capture(t.Context(), req("ch_slow", acquirer.TokenSlow))
	if err != nil || res.Status != chargeonce.StatusCaptured {
		t.Fatalf("retry = %+v, %v; want captured", res, err)
	}
	if st := sim.Stats(); st.Captures != 1 || st.DuplicateRequests != 1 {
		t.Fatalf("Stats = %+v; want one capture and one duplicate", st)
	}
}

func TestHTTPConcurrentSameReference(t *testing.T) {
	t.Parallel()
	sim, client, _ := setupHTTP(t, acquirer.Options{Latency: 20 * time.Millisecond})
	const n = 50
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			res, err := client.Capture(t.Context(), req("ch_race", acquirer.TokenOK))
			if err == nil && res.Status != chargeonce.StatusCaptured {
				err = errors.New("not captured: " + string(res.Status))
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	want := acquirer.Stats{CaptureRequests: n, Captures: 1, DuplicateRequests: n - 1}
	if st := sim.Stats(); st != want {
		t.Fatalf("Stats = %+v, want %+v", st, want)
	}
}

// do sends a raw request and returns the status, content type and body.
func do(t *testing.T, srv *httptest.Server, method, path, key, body string) (int, string, string) {
	t.Helper()
	r, err := http.NewRequestWithContext(t.Context(), method, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	r.Header.Set("Content-Type", "application/json")
	resp, err := srv.Client().Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
}

func TestHTTPWire(t *testing.T) {
	t.Parallel()
	_, _, srv := setupHTTP(t, acquirer.Options{})
	const body = `{"reference":"ch_w","order_id":1,"merchant":"m","amount_cents":5,"currency":"BRL","payment_token":"tok_ok"}`
	const noRef = `{"order_id":1,"merchant":"m","amount_cents":5,"currency":"BRL","payment_token":"tok_ok"}`

	tests := []struct {
		name, method, path, key, body string
		status                        int
		contains                      string // in the body
	}{
		{"captured", "POST", "/v1/captures", "ch_w", body, 200, `{"reference":"ch_w","status":"captured","decline_code":null}`},
		{"header only", "POST", "/v1/captures", "ch_hdr", noRef, 200, `"reference":"ch_hdr"`},
		{"quoted header", "POST", "/v1/captures", `"ch_w"`, body, 200, `"status":"captured"`},
		{"body only", "POST", "/v1/captures", "", body, 200, `"reference":"ch_w"`},
		{"declined", "POST", "/v1/captures", "ch_d", strings.ReplaceAll(strings.ReplaceAll(body, "tok_ok", "tok_declined"), "ch_w", "ch_d"), 200, `"decline_code":"insufficient_funds"`},
		{"fault", "POST", "/v1/captures", "ch_f", strings.ReplaceAll(strings.ReplaceAll(body, "tok_ok", "tok_fail_before"), "ch_w", "ch_f"), 503, `/unavailable"`},
		{"mismatch", "POST", "/v1/captures", "ch_other", body, 400, `"field":"reference"`},
		{"no reference", "POST", "/v1/captures", "", noRef, 400, `"field":"reference"`},
		{"bad header", "POST", "/v1/captures", `"unterminated`, body, 400, `/invalid-idempotency-key"`},
		{"unknown field", "POST", "/v1/captures", "", strings.Replace(body, `"order_id"`, `"orderid"`, 1), 400, `"field":"orderid"`},
		{"wrong type", "POST", "/v1/captures", "", strings.Replace(body, `"amount_cents":5`, `"amount_cents":"5"`, 1), 400, `"field":"amount_cents"`},
		{"invalid value", "POST", "/v1/captures", "", strings.Replace(body, `"BRL"`, `"brl"`, 1), 400, `"field":"currency"`},
		{"malformed", "POST", "/v1/captures", "", `{"reference":`, 400, `/validation-failed"`},
		{"two objects", "POST", "/v1/captures", "", body + body, 400, `"field":"body"`},
		{"empty", "POST", "/v1/captures", "", "", 400, `"field":"body"`},
		{"too large", "POST", "/v1/captures", "", `{"reference":"` + strings.Repeat("x", acquirer.MaxBodyBytes) + `"}`, 413, `/payload-too-large"`},
		{"get", "GET", "/v1/captures/ch_w", "", "", 200, `"decline_code":null`},
		{"get unknown", "GET", "/v1/captures/ch_nope", "", "", 404, `/not-found"`},
		{"list", "GET", "/v1/captures?order_id=1&merchant=m", "", "", 200, `"reference":"ch_hdr"`},
		{"list empty", "GET", "/v1/captures?order_id=2&merchant=m", "", "", 200, `[]`},
		{"list no order", "GET", "/v1/captures?merchant=m", "", "", 400, `"field":"order_id"`},
		{"list no merchant", "GET", "/v1/captures?order_id=1", "", "", 400, `"field":"merchant"`},
		{"stats", "GET", "/v1/stats", "", "", 200, `"capture_requests":`},
		{"method", "DELETE", "/v1/captures/ch_w", "", "", 405, `/method-not-allowed"`},
		{"no route", "GET", "/v2/nothing", "", "", 404, `/not-found"`},
	}
	// Sequential: later rows read what earlier rows captured.
	for _, tt := range tests {
		status, ctype, got := do(t, srv, tt.method, tt.path, tt.key, tt.body)
		wantType := "application/json"
		if tt.status != 200 {
			wantType = "application/problem+json"
		}
		if status != tt.status || ctype != wantType || !strings.Contains(got, tt.contains) {
			t.Errorf("%s: %s %s = %d %s %s\nwant %d %s containing %s", tt.name, tt.method, tt.path, status, ctype, got, tt.status, wantType, tt.contains)
		}
		if status != 200 {
			var p chargeonce.Problem
			if err := json.Unmarshal([]byte(got), &p); err != nil || p.Status != status || p.Title == "" || p.Detail == "" {
				t.Errorf("%s: problem %s is incomplete (%v)", tt.name, got, err)
			}
		}
	}

	_, _, got := do(t, srv, "GET", "/v1/stats", "", "")
	var st acquirer.Stats
	if err := json.Unmarshal([]byte(got), &st); err != nil {
		t.Fatal(err)
	}
	// ch_w three times (one capture, two duplicates), ch_hdr, ch_d, ch_f
	// (which captured nothing); the 400s never reached the simulator.
	want := acquirer.Stats{CaptureRequests: 6, Captures: 2, DuplicateRequests: 2}
	if st != want {
		t.Fatalf("stats = %+v, want %+v", st, want)
	}
}

// TestClientRejectsWhatItCannotTrust: anything but a clean 200 answer is an
// unknown outcome.
func TestClientRejectsWhatItCannotTrust(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		status int
		ctype  string
		body   string
	}{
		{"500", 500, "text/plain", "boom"},
		{"502 problem", 502, "application/problem+json", `{"status":502,"detail":"bad gateway"}`},
		{"garbage", 200, "application/json", `{"reference":`},
		{"not json", 200, "text/html", `<html></html>`},
		{"unknown status", 200, "application/json", `{"reference":"ch_x","status":"processing","decline_code":null}`},
		{"other reference", 200, "application/json", `{"reference":"ch_y","status":"captured","decline_code":null}`},
		{"captured with decline code", 200, "application/json", `{"reference":"ch_x","status":"captured","decline_code":"x"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if got := r.Header.Get("Idempotency-Key"); got != "ch_x" {
					t.Errorf("Idempotency-Key = %q, want the reference", got)
				}
				w.Header().Set("Content-Type", tt.ctype)
				w.WriteHeader(tt.status)
				_, _ = io.WriteString(w, tt.body)
			}))
			defer srv.Close()
			client := acquirer.NewClient(srv.URL, srv.Client())
			res, err := client.Capture(t.Context(), req("ch_x", acquirer.TokenOK))
			if err == nil {
				t.Fatalf("Capture = %+v, nil; want an error (outcome unknown)", res)
			}
			if errors.Is(err, acquirer.ErrUnavailable) {
				t.Fatalf("error %v matches ErrUnavailable; only 503 should", err)
			}
		})
	}
}

func TestClientTransportError(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close() // nothing listens there any more
	client := acquirer.NewClient(url, nil)
	if _, err := client.Capture(t.Context(), req("ch_x", acquirer.TokenOK)); err == nil || !strings.Contains(err.Error(), "ch_x") {
		t.Fatalf("Capture against a closed port = %v, want an error naming the reference", err)
	}
	if _, err := client.Stats(t.Context()); err == nil {
		t.Fatal("Stats against a closed port succeeded")
	}
}

// TestHTTPTooLargeChunked covers a body without Content-Length, which only
// MaxBytesReader can stop. (net/http then closes the connection after a short
// linger, so this runs apart from TestHTTPWire.)
func TestHTTPTooLargeChunked(t *testing.T) {
	t.Parallel()
	sim, _, srv := setupHTTP(t, acquirer.Options{})
	body := io.MultiReader(strings.NewReader(`{"reference":"`), strings.NewReader(strings.Repeat("x", acquirer.MaxBodyBytes)), strings.NewReader(`"}`))
	r, err := http.NewRequestWithContext(t.Context(), "POST", srv.URL+"/v1/captures", body)
	if err != nil {
		t.Fatal(err)
	}
	if r.ContentLength != 0 {
		t.Fatalf("ContentLength = %d; the test needs a chunked body", r.ContentLength)
	}
	resp, err := srv.Client().Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("status = %d, want 413", resp.StatusCode)
	}
	if st := sim.Stats(); st != (acquirer.Stats{}) {
		t.Fatalf("Stats = %+v; an oversized body must not reach the simulator", st)
	}
}
