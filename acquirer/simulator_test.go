package acquirer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
)

// Short delays keep the suite fast; they only need to be long enough for a
// second request to line up behind the first.
const (
	testSlow    = 80 * time.Millisecond
	testLatency = 20 * time.Millisecond
)

// setup returns a simulator that is closed (and its captures waited for)
// when the test ends.
func setup(t *testing.T, opts Options) *Simulator {
	t.Helper()
	if opts.Slow == 0 {
		opts.Slow = testSlow
	}
	s := NewSimulator(opts)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func captureReq(ref, token string) chargeonce.CaptureRequest {
	return chargeonce.CaptureRequest{
		Reference:    ref,
		OrderID:      42,
		Merchant:     "m1",
		AmountCents:  25000,
		Currency:     "BRL",
		PaymentToken: token,
	}
}

func captured(ref string) chargeonce.CaptureResult {
	return chargeonce.CaptureResult{Reference: ref, Status: chargeonce.StatusCaptured}
}

func declined(ref string) chargeonce.CaptureResult {
	return chargeonce.CaptureResult{Reference: ref, Status: chargeonce.StatusDeclined, DeclineCode: DeclineInsufficientFunds}
}

func wantStats(t *testing.T, s *Simulator, want Stats) {
	t.Helper()
	if got := s.Stats(); got != want {
		t.Fatalf("Stats() = %+v, want %+v", got, want)
	}
}

// waitUnderway waits until reference's capture has started.
func waitUnderway(t *testing.T, s *Simulator, reference string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !s.underway(reference) {
		if time.Now().After(deadline) {
			t.Fatalf("capture of %s never started", reference)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestTokens(t *testing.T) {
	t.Parallel()
	tests := []struct {
		token    string
		want     func(ref string) chargeonce.CaptureResult
		captures int64
		minTime  time.Duration
	}{
		{TokenOK, captured, 1, 0},
		{"tok_visa_4242", captured, 1, 0},
		{TokenDeclined, declined, 0, 0},
		{TokenSlow, captured, 1, testSlow},
	}
	for _, tt := range tests {
		t.Run(tt.token, func(t *testing.T) {
			t.Parallel()
			s := setup(t, Options{})
			ref := "ch_" + tt.token
			start := time.Now()
			res, err := s.Capture(t.Context(), captureReq(ref, tt.token))
			elapsed := time.Since(start)
			if err != nil {
				t.Fatalf("Capture: %v", err)
			}
			if want := tt.want(ref); res != want {
				t.Fatalf("Capture = %+v, want %+v", res, want)
			}
			if elapsed < tt.minTime {
				t.Fatalf("Capture took %s, want at least %s", elapsed, tt.minTime)
			}
			if tt.token != TokenSlow && elapsed > testSlow {
				t.Fatalf("Capture took %s; only tok_slow should be slow", elapsed)
			}
			c, ok := s.Get(ref)
			if !ok || c.Result() != res || c.AmountCents != 25000 || c.Merchant != "m1" || c.OrderID != 42 || c.Currency != "BRL" {
				t.Fatalf("Get = %+v, %v; want the capture behind %+v", c, ok, res)
			}
			wantStats(t, s, Stats{CaptureRequests: 1, Captures: tt.captures})

			// A repeated reference returns the first result and moves no money.
			again, err := s.Capture(t.Context(), captureReq(ref, tt.token))
			if err != nil || again != res {
				t.Fatalf("repeated Capture = %+v, %v; want %+v", again, err, res)
			}
			wantStats(t, s, Stats{CaptureRequests: 2, Captures: tt.captures, DuplicateRequests: 1})
		})
	}
}

func TestFailBeforeStrikesFirstRequestOnly(t *testing.T) {
	t.Parallel()
	s := setup(t, Options{})
	const ref = "ch_fail_before"

	_, err := s.Capture(t.Context(), captureReq(ref, TokenFailBefore))
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("first Capture error = %v, want ErrUnavailable", err)
	}
	if c, ok := s.Get(ref); ok {
		t.Fatalf("Get after tok_fail_before = %+v; want nothing captured", c)
	}
	wantStats(t, s, Stats{CaptureRequests: 1})

	// The retry is the first capture, not a duplicate.
	res, err := s.Capture(t.Context(), captureReq(ref, TokenFailBefore))
	if err != nil || res != captured(ref) {
		t.Fatalf("retry = %+v, %v; want captured", res, err)
	}
	wantStats(t, s, Stats{CaptureRequests: 2, Captures: 1})

	res, err = s.Capture(t.Context(), captureReq(ref, TokenFailBefore))
	if err != nil || res != captured(ref) {
		t.Fatalf("third request = %+v, %v; want captured", res, err)
	}
	wantStats(t, s, Stats{CaptureRequests: 3, Captures: 1, DuplicateRequests: 1})
	if n := s.CapturedCount("m1", 42); n != 1 {
		t.Fatalf("CapturedCount = %d, want 1", n)
	}
}

func TestFailAfterStrikesFirstRequestOnly(t *testing.T) {
	t.Parallel()
	s := setup(t, Options{})
	const ref = "ch_fail_after"

	_, err := s.Capture(t.Context(), captureReq(ref, TokenFailAfter))
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("first Capture error = %v, want ErrUnavailable", err)
	}
	// The money moved even though the reply was lost.
	if c, ok := s.Get(ref); !ok || c.Status != chargeonce.StatusCaptured {
		t.Fatalf("Get after tok_fail_after = %+v, %v; want captured", c, ok)
	}
	wantStats(t, s, Stats{CaptureRequests: 1, Captures: 1})

	res, err := s.Capture(t.Context(), captureReq(ref, TokenFailAfter))
	if err != nil || res != captured(ref) {
		t.Fatalf("retry = %+v, %v; want captured", res, err)
	}
	wantStats(t, s, Stats{CaptureRequests: 2, Captures: 1, DuplicateRequests: 1})
}

// TestConcurrentSameReference races 50 requests for one reference: exactly
// one capture, every other request a duplicate, everyone the same result.
func TestConcurrentSameReference(t *testing.T) {
	t.Parallel()
	const n = 50
	tests := []struct {
		token      string
		wantErrors int // requests answered 503: the fault strikes one request
		dups       int64
	}{
		{TokenOK, 0, n - 1},
		{TokenSlow, 0, n - 1},
		{TokenDeclined, 0, n - 1},
		// The failed first run captured nothing: one of the waiters captures,
		// the rest are duplicates of that capture.
		{TokenFailBefore, 1, n - 2},
		// The first request loses its reply; the waiters get the capture.
		{TokenFailAfter, 1, n - 1},
	}
	for _, tt := range tests {
		t.Run(tt.token, func(t *testing.T) {
			t.Parallel()
			s := setup(t, Options{Latency: testLatency})
			ref := "ch_race_" + tt.token
			want := captured(ref)
			var wantCaptures int64 = 1
			if tt.token == TokenDeclined {
				want, wantCaptures = declined(ref), 0
			}

			var (
				wg      sync.WaitGroup
				startCh = make(chan struct{})
				results = make([]chargeonce.CaptureResult, n)
				errs    = make([]error, n)
			)
			for i := range n {
				wg.Go(func() {
					<-startCh
					results[i], errs[i] = s.Capture(t.Context(), captureReq(ref, tt.token))
				})
			}
			close(startCh)
			wg.Wait()

			failed := 0
			for i := range n {
				if errs[i] != nil {
					if !errors.Is(errs[i], ErrUnavailable) {
						t.Fatalf("request %d: %v", i, errs[i])
					}
					failed++
					continue
				}
				if results[i] != want {
					t.Fatalf("request %d = %+v, want %+v", i, results[i], want)
				}
			}
			if failed != tt.wantErrors {
				t.Fatalf("%d requests failed, want %d", failed, tt.wantErrors)
			}
			wantStats(t, s, Stats{CaptureRequests: n, Captures: wantCaptures, DuplicateRequests: tt.dups})
			if got := len(s.ListByOrder(42, "m1")); got != 1 {
				t.Fatalf("ListByOrder has %d captures, want 1", got)
			}
		})
	}
}

func TestWaiterGetsResultOfCaptureUnderWay(t *testing.T) {
	t.Parallel()
	s := setup(t, Options{})
	const ref = "ch_waiter"

	start := time.Now()
	first := make(chan error, 1)
	go func() {
		_, err := s.Capture(context.Background(), captureReq(ref, TokenSlow))
		first <- err
	}()
	waitUnderway(t, s, ref)

	// The waiter's own token would be fast; it must join the slow capture
	// instead of starting a second one.
	res, err := s.Capture(t.Context(), captureReq(ref, TokenOK))
	if err != nil || res != captured(ref) {
		t.Fatalf("waiter = %+v, %v; want captured", res, err)
	}
	if elapsed := time.Since(start); elapsed < testSlow {
		t.Fatalf("waiter answered after %s, before the first capture (%s) finished", elapsed, testSlow)
	}
	if err := <-first; err != nil {
		t.Fatalf("first request: %v", err)
	}
	wantStats(t, s, Stats{CaptureRequests: 2, Captures: 1, DuplicateRequests: 1})
}

func TestWaiterHonoursItsContext(t *testing.T) {
	t.Parallel()
	s := setup(t, Options{})
	const ref = "ch_waiter_gives_up"

	first := make(chan error, 1)
	go func() {
		_, err := s.Capture(context.Background(), captureReq(ref, TokenSlow))
		first <- err
	}()
	waitUnderway(t, s, ref)

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Millisecond)
	defer cancel()
	if _, err := s.Capture(ctx, captureReq(ref, TokenSlow)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiter error = %v, want context.DeadlineExceeded", err)
	}
	if err := <-first; err != nil {
		t.Fatalf("first request: %v", err)
	}
	wantStats(t, s, Stats{CaptureRequests: 2, Captures: 1, DuplicateRequests: 1})
}

// TestSlowCaptureCompletesWhenCallerGivesUp is the case chargeonce's
// recovery exists for: the caller times out, the money moves anyway, and a
// retry with the same reference finds that capture instead of making another.
func TestSlowCaptureCompletesWhenCallerGivesUp(t *testing.T) {
	t.Parallel()
	s := setup(t, Options{})
	const ref = "ch_slow_abandoned"

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := s.Capture(ctx, captureReq(ref, TokenSlow))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Capture error = %v, want context.DeadlineExceeded", err)
	}
	if elapsed := time.Since(start); elapsed >= testSlow {
		t.Fatalf("the caller waited %s; it should stop waiting when its context ends", elapsed)
	}
	if _, ok := s.Get(ref); ok {
		t.Fatal("the capture settled before tok_slow's delay")
	}

	s.Wait()
	if c, ok := s.Get(ref); !ok || c.Status != chargeonce.StatusCaptured {
		t.Fatalf("Get after Wait = %+v, %v; want captured", c, ok)
	}
	wantStats(t, s, Stats{CaptureRequests: 1, Captures: 1})

	res, err := s.Capture(t.Context(), captureReq(ref, TokenSlow))
	if err != nil || res != captured(ref) {
		t.Fatalf("retry = %+v, %v; want captured", res, err)
	}
	wantStats(t, s, Stats{CaptureRequests: 2, Captures: 1, DuplicateRequests: 1})
}

func TestCancelledBeforeSendingIsNotARequest(t *testing.T) {
	t.Parallel()
	s := setup(t, Options{})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := s.Capture(ctx, captureReq("ch_never_sent", TokenOK)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Capture error = %v, want context.Canceled", err)
	}
	if _, ok := s.Get("ch_never_sent"); ok {
		t.Fatal("a request whose context had ended captured")
	}
	wantStats(t, s, Stats{})
}

func TestLatency(t *testing.T) {
	t.Parallel()
	s := setup(t, Options{Latency: testLatency})
	const ref = "ch_latency"
	for i, name := range []string{"first", "duplicate"} {
		start := time.Now()
		if _, err := s.Capture(t.Context(), captureReq(ref, TokenOK)); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if elapsed := time.Since(start); elapsed < testLatency {
			t.Fatalf("%s request (%d) took %s, want at least the latency %s", name, i, elapsed, testLatency)
		}
	}

	// A duplicate abandoned during its latency moves nothing and says why.
	ctx, cancel := context.WithTimeout(t.Context(), time.Millisecond)
	defer cancel()
	if _, err := s.Capture(ctx, captureReq(ref, TokenOK)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("abandoned duplicate error = %v, want context.DeadlineExceeded", err)
	}
	wantStats(t, s, Stats{CaptureRequests: 3, Captures: 1, DuplicateRequests: 2})
}

func TestInvalidRequests(t *testing.T) {
	t.Parallel()
	s := setup(t, Options{})
	tests := []struct {
		field  string
		mutate func(*chargeonce.CaptureRequest)
	}{
		{"reference", func(r *chargeonce.CaptureRequest) { r.Reference = "" }},
		{"reference", func(r *chargeonce.CaptureRequest) { r.Reference = "has space" }},
		{"reference", func(r *chargeonce.CaptureRequest) { r.Reference = strings.Repeat("x", MaxReferenceLen+1) }},
		{"order_id", func(r *chargeonce.CaptureRequest) { r.OrderID = 0 }},
		{"merchant", func(r *chargeonce.CaptureRequest) { r.Merchant = "" }},
		{"amount_cents", func(r *chargeonce.CaptureRequest) { r.AmountCents = -1 }},
		{"currency", func(r *chargeonce.CaptureRequest) { r.Currency = "brl" }},
		{"currency", func(r *chargeonce.CaptureRequest) { r.Currency = "" }},
		{"payment_token", func(r *chargeonce.CaptureRequest) { r.PaymentToken = "" }},
	}
	for _, tt := range tests {
		req := captureReq("ch_invalid", TokenOK)
		tt.mutate(&req)
		_, err := s.Capture(t.Context(), req)
		var e *chargeonce.Error
		if !errors.As(err, &e) || e.Code != chargeonce.EINVALID || e.Field != tt.field {
			t.Errorf("Capture(%+v) error = %v, want EINVALID on %s", req, err, tt.field)
		}
	}
	wantStats(t, s, Stats{})
}

func TestListByOrderAndCapturedCount(t *testing.T) {
	t.Parallel()
	s := setup(t, Options{})
	reqs := []chargeonce.CaptureRequest{
		captureReq("ch_a", TokenOK),
		captureReq("ch_b", TokenDeclined),
		captureReq("ch_c", TokenOK), // a second capture for the order: a double charge
	}
	other := captureReq("ch_other_merchant", TokenOK)
	other.Merchant = "m2"
	otherOrder := captureReq("ch_other_order", TokenOK)
	otherOrder.OrderID = 43
	for _, req := range append(reqs, other, otherOrder) {
		if _, err := s.Capture(t.Context(), req); err != nil {
			t.Fatalf("Capture %s: %v", req.Reference, err)
		}
	}

	list := s.ListByOrder(42, "m1")
	var refs []string
	for _, c := range list {
		refs = append(refs, c.Reference)
	}
	if got := strings.Join(refs, ","); got != "ch_a,ch_b,ch_c" {
		t.Fatalf("ListByOrder(42, m1) = %s, want ch_a,ch_b,ch_c", got)
	}
	if n := s.CapturedCount("m1", 42); n != 2 {
		t.Fatalf("CapturedCount(m1, 42) = %d, want 2 (the decline moved no money)", n)
	}
	if n := s.CapturedCount("m2", 42); n != 1 {
		t.Fatalf("CapturedCount(m2, 42) = %d, want 1", n)
	}
	if l := s.ListByOrder(99, "m1"); l == nil || len(l) != 0 {
		t.Fatalf("ListByOrder of an unknown order = %#v, want an empty slice", l)
	}
	if all := s.Captures(); len(all) != 5 {
		t.Fatalf("Captures() has %d entries, want 5", len(all))
	}
}

func TestCaptureJSON(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	c := Capture{Reference: "ch_1", OrderID: 1, Merchant: "m", AmountCents: 100, Currency: "BRL", Status: chargeonce.StatusCaptured, CreatedAt: at}
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"reference":"ch_1","order_id":1,"merchant":"m","amount_cents":100,"currency":"BRL","status":"captured","decline_code":null,"created_at":"2026-12-02T10:00:00Z"}`
	if string(b) != want {
		t.Fatalf("captured JSON = %s\nwant %s", b, want)
	}
	c.Status, c.DeclineCode = chargeonce.StatusDeclined, DeclineInsufficientFunds
	b, _ = json.Marshal(c)
	var back Capture
	if err := json.Unmarshal(b, &back); err != nil || back != c {
		t.Fatalf("round trip of %s = %+v, %v; want %+v", b, back, err, c)
	}
}

func TestCloseSettlesCapturesUnderWay(t *testing.T) {
	t.Parallel()
	s := NewSimulator(Options{Slow: time.Hour})
	const ref = "ch_closed"
	first := make(chan error, 1)
	go func() {
		_, err := s.Capture(context.Background(), captureReq(ref, TokenSlow))
		first <- err
	}()
	waitUnderway(t, s, ref)

	done := make(chan struct{})
	go func() {
		_ = s.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close waited for tok_slow's whole delay")
	}
	if err := <-first; err != nil {
		t.Fatalf("request under way at Close: %v", err)
	}
	if c, ok := s.Get(ref); !ok || c.Status != chargeonce.StatusCaptured {
		t.Fatalf("Get after Close = %+v, %v; want captured", c, ok)
	}
	if _, err := s.Capture(t.Context(), captureReq("ch_after_close", TokenOK)); !errors.Is(err, ErrClosed) {
		t.Fatalf("Capture after Close error = %v, want ErrClosed", err)
	}
	_ = s.Close() // idempotent
}

func TestOptions(t *testing.T) {
	t.Parallel()
	if err := (Options{}).Validate(); err != nil {
		t.Fatalf("zero Options: %v", err)
	}
	for _, o := range []Options{{Latency: -1}, {Slow: -time.Second}} {
		err := o.Validate()
		if err == nil || !strings.Contains(err.Error(), "--") {
			t.Errorf("Validate(%+v) = %v, want an error naming the flag", o, err)
		}
	}
	if s := NewSimulator(Options{}); s.opts.Slow != DefaultSlow {
		t.Fatalf("default Slow = %s, want %s", s.opts.Slow, DefaultSlow)
	}
}

// TestManyReferences exercises the simulator under -race with many
// references and repeats at once: each reference captures exactly once.
func TestManyReferences(t *testing.T) {
	t.Parallel()
	s := setup(t, Options{})
	const refs, repeats = 200, 5
	var wg sync.WaitGroup
	for i := range refs {
		for range repeats {
			wg.Go(func() {
				req := captureReq(fmt.Sprintf("ch_%d", i), TokenOK)
				req.OrderID = int64(i + 1)
				if _, err := s.Capture(t.Context(), req); err != nil {
					t.Error(err)
				}
				_ = s.Stats()
				_, _ = s.Get(req.Reference)
			})
		}
	}
	wg.Wait()
	wantStats(t, s, Stats{CaptureRequests: refs * repeats, Captures: refs, DuplicateRequests: refs * (repeats - 1)})
	for i := range refs {
		if n := s.CapturedCount("m1", int64(i+1)); n != 1 {
			t.Fatalf("order %d captured %d times", i+1, n)
		}
	}
}
