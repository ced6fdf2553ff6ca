package e2e

import (
	"bytes"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/internal/pgtest"
)

// TestGracefulShutdownUnderLoad: two serve processes share one PostgreSQL
// database and a stand-alone acquirer whose captures take a while. Instance
// A gets a batch of charges, all of them waiting at the acquirer, plus a
// steady stream of new ones, and is sent SIGTERM. Every request A had
// received gets its final answer, A exits 0 within its shutdown deadline,
// and every intent — answered by A or cut off by the shutdown — settles
// exactly once when retried through instance B.
func TestGracefulShutdownUnderLoad(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	ps := newProcs(t)
	const latency = 800 * time.Millisecond
	acq := ps.startAcquirer("acquirer", "--latency", latency.String())
	flags := []string{"--lease", "6s", "--acquirer-timeout", "3s", "--reconcile-every", "200ms"}
	dbURL := withParams(url, "pool_max_conns", "8")
	a := ps.start("serve-a", serveArgs(dbURL, acq.URL(), flags...)...)
	b := ps.start("serve-b", serveArgs(dbURL, acq.URL(), flags...)...)
	ac := acquirerClient(acq)

	type intent struct {
		key   string
		order int64
		body  []byte
		first answer // A's answer
	}
	var (
		mu      sync.Mutex
		intents []*intent
	)
	send := func(c *http.Client) *intent {
		in := &intent{key: uniqueName("term-"), order: newOrder()}
		in.body = chargeBody(in.order, "tok_ok")
		in.first = charge(c, a.URL(), in.key, in.body)
		mu.Lock()
		intents = append(intents, in)
		mu.Unlock()
		return in
	}

	// The batch: every request is at the acquirer, so A has received all of
	// them, when SIGTERM arrives.
	const batch = 20
	var wg sync.WaitGroup
	batchAnswers := make(chan *intent, batch)
	for range batch {
		wg.Add(1)
		go func() {
			defer wg.Done()
			batchAnswers <- send(&http.Client{Timeout: 30 * time.Second})
		}()
	}
	apitest.Eventually(t, 30*time.Second, "the whole batch to reach the acquirer", func() bool {
		st, err := ac.Stats(t.Context())
		return err == nil && st.CaptureRequests >= batch
	})

	// The stream: new intents keep arriving until A is gone.
	stop := make(chan struct{})
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &http.Client{Timeout: 30 * time.Second}
			for {
				select {
				case <-stop:
					return
				default:
				}
				if in := send(c); in.first.err != nil {
					time.Sleep(20 * time.Millisecond) // A is going away
				}
			}
		}()
	}
	time.Sleep(300 * time.Millisecond) // let the stream put requests in flight too

	sent := time.Now()
	a.signal(syscall.SIGTERM)
	const deadline = 10*time.Second + 5*time.Second // serve's shutdownTimeout plus start-up slack
	if !a.wait(deadline) {
		t.Fatalf("serve did not exit within %s of SIGTERM", deadline)
	}
	exited := time.Since(sent)
	if err := a.exitErr(); err != nil {
		t.Fatalf("serve exited with %v after SIGTERM", err)
	}
	close(stop)
	wg.Wait()
	close(batchAnswers)

	for in := range batchAnswers {
		if in.first.err != nil || in.first.status != 201 {
			t.Errorf("%s: a request A had received got %s, want its 201", in.key, in.first)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	// Every intent settles once through B: what A answered is replayed byte
	// for byte; what A never answered is charged now, once.
	answered, cut := 0, 0
	for _, in := range intents {
		final, _ := untilFinal(t, 30*time.Second, func() []string { return []string{b.URL()} }, in.key, in.body)
		if final.status != 201 {
			t.Fatalf("%s: final answer %s, want 201", in.key, final)
		}
		switch {
		case in.first.err == nil && in.first.status == 201:
			answered++
			if !bytes.Equal(final.body, in.first.body) || final.header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("%s: B answered %s, want A's %s replayed", in.key, final, in.first)
			}
		case in.first.err != nil:
			cut++
		default:
			t.Fatalf("%s: A answered %s during shutdown; want 201 or no answer", in.key, in.first)
		}
		wantOneCapture(t, ac, in.order, decodeCharge(t, final.body).ID)
	}
	st, err := ac.Stats(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.Captures != int64(len(intents)) {
		t.Fatalf("acquirer stats %+v for %d intents; want one capture each", st, len(intents))
	}
	t.Logf("SIGTERM with %d requests at the acquirer (%s each) and a stream of new ones: A exited 0 after %v; "+
		"%d intents: %d answered 201 by A, %d cut off (connection refused or closed) and charged once through B; acquirer %+v",
		batch, latency, exited.Round(time.Millisecond), len(intents), answered, cut, st)
	if answered < batch {
		t.Fatalf("only %d answers from A", answered)
	}
}
