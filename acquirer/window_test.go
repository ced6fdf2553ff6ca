package acquirer

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
)

// TestIdempotencyWindow: within the window a repeated reference returns
// the first result and moves no money; after it, the simulator has
// forgotten the reference and captures again, while Get and Lookup still
// find the first capture.
func TestIdempotencyWindow(t *testing.T) {
	t.Parallel()
	const window = 150 * time.Millisecond
	s := setup(t, Options{IdempotencyWindow: window})
	ctx := context.Background()
	if _, err := s.Capture(ctx, captureReq("ch_w", TokenOK)); err != nil {
		t.Fatal(err)
	}
	first, _ := s.Get("ch_w")
	if _, err := s.Capture(ctx, captureReq("ch_w", TokenOK)); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Captures != 1 || st.DuplicateRequests != 1 {
		t.Fatalf("within the window: %+v; want 1 capture and 1 duplicate", st)
	}
	time.Sleep(window + 50*time.Millisecond)
	if _, err := s.Capture(ctx, captureReq("ch_w", TokenOK)); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Captures != 2 || st.CaptureRequests != 3 {
		t.Fatalf("after the window: %+v; want the repeated request to capture again", st)
	}
	if n := s.CapturedCount("m1", 42); n != 2 {
		t.Fatalf("CapturedCount = %d, want 2", n)
	}
	// The new capture opened a new window: a request right after it is a
	// duplicate again.
	if _, err := s.Capture(ctx, captureReq("ch_w", TokenOK)); err != nil || s.Stats().Captures != 2 {
		t.Fatalf("within the new window: %+v, %v; want no third capture", s.Stats(), err)
	}
	if c, ok := s.Get("ch_w"); !ok || !c.CreatedAt.Equal(first.CreatedAt) {
		t.Fatalf("Get = %+v, %v; want the first capture", c, ok)
	}
	if lr, err := s.Lookup(ctx, chargeonce.LookupRequest{Reference: "ch_w"}); err != nil || lr.Status != chargeonce.LookupFound || lr.Result != captured("ch_w") {
		t.Fatalf("Lookup = %+v, %v; want the first capture", lr, err)
	}
}

// TestLookup: found for a settled capture (captured or declined), safe to
// send for a reference never seen or whose only request
// captured nothing, and an unknown state for a caller that stops waiting
// for a capture under way, in-process and over HTTP alike.
func TestLookup(t *testing.T) {
	t.Parallel()
	s := setup(t, Options{})
	srv := httptest.NewServer(Handler(s))
	t.Cleanup(srv.Close)
	client := NewClient(srv.URL, nil)
	ctx := context.Background()
	if _, err := s.Capture(ctx, captureReq("ch_ok", TokenOK)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Capture(ctx, captureReq("ch_no", TokenDeclined)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Capture(ctx, captureReq("ch_fb", TokenFailBefore)); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("tok_fail_before: %v", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = s.Capture(ctx, captureReq("ch_slow", TokenSlow))
	}()
	t.Cleanup(func() { <-done })
	for !s.underway("ch_slow") {
		time.Sleep(time.Millisecond)
	}
	for name, acq := range map[string]chargeonce.Acquirer{"in-process": s, "http": client} {
		for ref, want := range map[string]chargeonce.CaptureResult{"ch_ok": captured("ch_ok"), "ch_no": {Reference: "ch_no", Status: chargeonce.StatusDeclined, DeclineCode: DeclineInsufficientFunds}} {
			if lr, err := acq.Lookup(ctx, chargeonce.LookupRequest{Reference: ref}); err != nil || lr.Status != chargeonce.LookupFound || lr.Result != want {
				t.Errorf("%s: Lookup(%s) = %+v, %v; want %+v", name, ref, lr, err, want)
			}
		}
		for _, ref := range []string{"ch_never", "ch_fb"} {
			if lr, err := acq.Lookup(ctx, chargeonce.LookupRequest{Reference: ref}); err != nil || lr.Status != chargeonce.LookupSafeToSend {
				t.Errorf("%s: Lookup(%s) = %+v, %v; want safe to send", name, ref, lr, err)
			}
		}
		short, cancel := context.WithTimeout(ctx, 5*time.Millisecond)
		if lr, err := acq.Lookup(short, chargeonce.LookupRequest{Reference: "ch_slow"}); err == nil || lr.Status != chargeonce.LookupUnsure {
			t.Errorf("%s: Lookup that gave up on a capture under way = %+v, err %v; want an error (unknown)", name, lr, err)
		}
		cancel()
	}
	// A caller that waits gets the capture once it settles.
	for name, acq := range map[string]chargeonce.Acquirer{"in-process": s, "http": client} {
		if lr, err := acq.Lookup(ctx, chargeonce.LookupRequest{Reference: "ch_slow"}); err != nil || lr.Status != chargeonce.LookupFound || lr.Result != captured("ch_slow") {
			t.Errorf("%s: Lookup waiting for a capture under way = %+v, %v; want it captured", name, lr, err)
		}
	}
	if st := s.Stats(); st.CaptureRequests != 4 {
		t.Errorf("stats %+v: lookups must not count as capture requests", st)
	}
}

// TestRejectedCaptures: a capture request the acquirer refuses (invalid,
// answered 4xx) matches chargeonce.ErrCaptureRejected, in-process and over
// HTTP; a 503 and the 4xx answers about configuration or timing do not.
func TestRejectedCaptures(t *testing.T) {
	t.Parallel()
	s := setup(t, Options{})
	srv := httptest.NewServer(Handler(s))
	t.Cleanup(srv.Close)
	client := NewClient(srv.URL, nil)
	bad := captureReq("ch_bad", TokenOK)
	bad.Currency = "brl"
	for name, acq := range map[string]chargeonce.Acquirer{"in-process": s, "http": client} {
		if _, err := acq.Capture(context.Background(), bad); !errors.Is(err, chargeonce.ErrCaptureRejected) {
			t.Errorf("%s: invalid capture: %v; want ErrCaptureRejected", name, err)
		}
		if _, err := acq.Capture(context.Background(), captureReq("ch_fb_"+name, TokenFailBefore)); err == nil || errors.Is(err, chargeonce.ErrCaptureRejected) {
			t.Errorf("%s: 503: %v; want an unknown outcome, not a rejection", name, err)
		}
	}
	for status, want := range map[int]bool{400: true, 402: true, 422: true, 401: false, 403: false, 404: false, 408: false, 409: false, 429: false, 500: false, 503: false} {
		if got := errors.Is(&StatusError{StatusCode: status}, chargeonce.ErrCaptureRejected); got != want {
			t.Errorf("status %d: rejected=%v, want %v", status, got, want)
		}
	}
}
