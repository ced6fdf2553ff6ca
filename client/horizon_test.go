package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/client"
	"github.com/chargeonce/chargeonce/engine"
)

// The default retry horizon outlasts a crashed instance's lease plus the
// acquirer timeout, the service's defaults: a caller whose attempt was held
// by an instance that died keeps retrying until a retry can finish the
// charge, instead of giving up first (the old default of 8 attempts gave up
// after about 16s, half the lease).
func TestDefaultRetryOutlastsLease(t *testing.T) {
	t.Parallel()
	if need := engine.DefaultLease + engine.DefaultAcquirerTimeout; client.DefaultRetryFor < need {
		t.Fatalf("DefaultRetryFor = %s, shorter than the service's lease plus acquirer timeout (%s)", client.DefaultRetryFor, need)
	}
	if client.DefaultMaxAttempts != 0 {
		t.Fatalf("DefaultMaxAttempts = %d; want no count bound by default (the horizon bounds the call)", client.DefaultMaxAttempts)
	}
}

// By default the number of attempts is not what ends a call: a service that
// answers 503 twelve times and then 201 is waited out.
func TestDefaultIsNotBoundedByAttemptCount(t *testing.T) {
	t.Parallel()
	srv, count := scripted(t, func(n int64, w http.ResponseWriter) {
		if n <= 12 {
			problemAnswer(w, 503, "unavailable")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(201)
		fmt.Fprint(w, `{"id":"ch_1","order_id":7,"amount_cents":25000,"currency":"BRL","status":"captured","decline_code":null,"created_at":"2026-12-02T10:00:00Z"}`)
	})
	c := newClient(t, srv.URL) // default policy, short waits
	ch, err := c.CreateCharge(context.Background(), charge(7, "tok_ok"))
	if err != nil {
		t.Fatalf("CreateCharge after 12 answers of 503: %v (attempts %d); want the 201", err, client.Attempts(err))
	}
	if ch.Attempts != 13 || count.Load() != 13 {
		t.Fatalf("attempts %d, requests %d; want 13", ch.Attempts, count.Load())
	}
}

// The retry horizon ends a call that gets no final answer, with a
// GaveUpError that carries the key the client made up for the intent: the
// key every attempt sent.
func TestRetryHorizonGivesUpWithTheKey(t *testing.T) {
	t.Parallel()
	var (
		mu   sync.Mutex
		keys = map[string]int{}
		n    atomic.Int64
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		mu.Lock()
		keys[r.Header.Get("Idempotency-Key")]++
		mu.Unlock()
		problemAnswer(w, 503, "unavailable")
	}))
	t.Cleanup(srv.Close)
	c := newClient(t, srv.URL, client.WithRetryFor(400*time.Millisecond))
	start := time.Now()
	_, err := c.CreateCharge(context.Background(), charge(7, "tok_ok"))
	took := time.Since(start)
	var gu *client.GaveUpError
	if !errors.As(err, &gu) || !errors.Is(err, client.ErrRetryWindowExhausted) {
		t.Fatalf("err = %v; want a GaveUpError for the retry horizon", err)
	}
	if took > 5*time.Second {
		t.Fatalf("the call took %s with a 400ms horizon", took)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(keys) != 1 || keys[gu.Key] != int(n.Load()) || !uuidV4.MatchString(gu.Key) || n.Load() < 2 {
		t.Fatalf("GaveUpError.Key = %q; the attempts sent %v (%d requests); want the one key every attempt sent", gu.Key, keys, n.Load())
	}
}

// A caller that gave up resumes with GaveUpError.Key: the first call's
// attempt timed out while the service was still charging, its retries got
// 409 until the short horizon passed; the second call, with the key the
// error carried, learns that the charge was captured (a replay), and the
// acquirer moved money once. The replay is the only success this caller
// ever sees for the intent: it must fulfil the order on it.
func TestResumeWithTheKeyOfGaveUpError(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			f := setup(t, kind, engine.Options{AcquirerTimeout: 5 * time.Second}, acquirer.Options{Slow: 1500 * time.Millisecond})
			c := newClient(t, f.inst.URL, client.WithAttemptTimeout(200*time.Millisecond), client.WithRetryFor(600*time.Millisecond))
			order := orderSeq.Add(1)
			req := charge(order, "tok_slow")
			_, err := c.CreateCharge(context.Background(), req)
			var gu *client.GaveUpError
			if !errors.As(err, &gu) || gu.Key == "" {
				t.Fatalf("first call: %v; want a GaveUpError with the key", err)
			}

			resume := newClient(t, f.inst.URL)
			req.IdempotencyKey = gu.Key
			ch, err := resume.CreateCharge(context.Background(), req)
			if err != nil {
				t.Fatalf("resuming with key %s: %v", gu.Key, err)
			}
			if !ch.Replayed {
				t.Fatalf("the resumed call got a fresh answer; want the first call's charge, replayed")
			}
			wantCapturedOnce(t, f, ch, order)
		})
	}
}
