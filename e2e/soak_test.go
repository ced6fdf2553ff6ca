package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/chargeonce/chargeonce/internal/pgtest"
)

// TestSoak: a few hundred intents with random faults (every test token),
// random client timeouts, some intents submitted twice at once, over three
// serve processes sharing one PostgreSQL database and a stand-alone
// acquirer. Part-way through, one instance is killed with SIGKILL and
// restarted. Afterwards there must be zero doubles (no order captured twice,
// no intent with two charges), zero intents without a final answer, and as
// many captures at the acquirer as captured charges in the database.
func TestSoak(t *testing.T) {
	t.Parallel()
	const (
		intents   = 600
		instances = 3
		workers   = 12
		// deadline bounds the whole run; an intent still without a final
		// answer then counts as a failure.
		deadline = 90 * time.Second
	)
	url := pgtest.URL(t)
	ps := newProcs(t)
	acq := ps.startAcquirer("acquirer", "--slow", "1s", "--latency", "50ms")
	flags := []string{"--lease", "2s", "--acquirer-timeout", "700ms", "--reconcile-every", "200ms"}
	dbURL := withParams(url, "pool_max_conns", "5")
	var (
		mu    sync.Mutex
		insts []*proc
		up    []bool
	)
	for i := range instances {
		insts = append(insts, ps.start(fmt.Sprintf("serve-%d", i), serveArgs(dbURL, acq.URL(), flags...)...))
		up = append(up, true)
	}
	pick := func(rng *rand.Rand) string {
		mu.Lock()
		defer mu.Unlock()
		for {
			if i := rng.IntN(len(insts)); up[i] {
				return insts[i].URL()
			}
		}
	}

	type intent struct {
		key, token string
		order      int64
		body       []byte
		dup        bool     // submitted by two clients at once
		finals     []answer // the final answer each client got
	}
	tokens := []struct {
		token  string
		weight int
	}{{"tok_ok", 45}, {"tok_declined", 10}, {"tok_fail_before", 15}, {"tok_fail_after", 15}, {"tok_slow", 15}}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	all := make([]*intent, intents)
	for i := range all {
		n, tok := rng.IntN(100), ""
		for _, w := range tokens {
			if n -= w.weight; n < 0 {
				tok = w.token
				break
			}
		}
		order := newOrder()
		all[i] = &intent{key: uniqueName("soak-"), token: tok, order: order, body: chargeBody(order, tok), dup: rng.IntN(10) == 0}
	}

	transport := &http.Transport{MaxIdleConnsPerHost: 64}
	defer transport.CloseIdleConnections()
	var attempts, timeouts, refused, conflicts, pending, serverErrs atomic.Int64
	stop := time.Now().Add(deadline)
	// client drives one intent to a final answer as a client would: retry on
	// timeouts, broken connections, 202, 409 and 5xx, on any live instance.
	client := func(in *intent, seed uint64) answer {
		rng := rand.New(rand.NewPCG(seed, 2))
		for time.Now().Before(stop) {
			// A third of the attempts give up quickly, often while the
			// acquirer call is under way; the others wait up to 2s.
			timeout := time.Duration(100+rng.IntN(1900)) * time.Millisecond
			if rng.IntN(3) == 0 {
				timeout = time.Duration(10+rng.IntN(90)) * time.Millisecond
			}
			c := &http.Client{Transport: transport, Timeout: timeout}
			a := charge(c, pick(rng), in.key, in.body)
			attempts.Add(1)
			switch {
			case a.final():
				return a
			case a.err != nil && isTimeout(a.err):
				timeouts.Add(1)
			case a.err != nil:
				refused.Add(1)
			case a.status == 409:
				conflicts.Add(1)
			case a.status == 202:
				pending.Add(1)
			case a.status >= 500:
				serverErrs.Add(1)
			default:
				t.Errorf("%s (%s): unexpected answer %s", in.key, in.token, a)
				return answer{}
			}
			time.Sleep(time.Duration(50+rng.IntN(200)) * time.Millisecond)
		}
		return answer{}
	}

	var done atomic.Int64
	killAt := int64(intents / 3)
	var killed sync.WaitGroup
	killed.Add(1)
	start := time.Now()
	var killedAt, restartedAt time.Duration
	go func() {
		defer killed.Done()
		for done.Load() < killAt && time.Now().Before(stop) {
			time.Sleep(20 * time.Millisecond)
		}
		victim := insts[0]
		victim.kill()
		killedAt = time.Since(start)
		mu.Lock()
		up[0] = false
		mu.Unlock()
		time.Sleep(2 * time.Second)
		victim.restart()
		restartedAt = time.Since(start)
		mu.Lock()
		up[0] = true
		mu.Unlock()
	}()

	work := make(chan *intent)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for in := range work {
				clients := 1
				if in.dup {
					clients = 2
				}
				finals := make([]answer, clients)
				var cw sync.WaitGroup
				for c := range clients {
					cw.Go(func() { finals[c] = client(in, uint64(w)<<32|uint64(in.order)<<1|uint64(c)) })
				}
				cw.Wait()
				in.finals = finals
				done.Add(1)
			}
		})
	}
	for _, in := range all {
		work <- in
	}
	close(work)
	wg.Wait()
	killed.Wait()
	elapsed := time.Since(start)

	// Zero intents without a final answer: every client got 201 or 402,
	// the same bytes as every other client of its intent, and the status
	// the token calls for.
	withoutFinal, mismatched := 0, 0
	approved, dups := 0, 0
	for _, in := range all {
		if in.dup {
			dups++
		}
		want := 201
		if in.token == "tok_declined" {
			want = 402
		} else {
			approved++
		}
		for _, f := range in.finals {
			if !f.final() {
				withoutFinal++
				t.Errorf("%s (%s, order %d): no final answer within %s", in.key, in.token, in.order, deadline)
				continue
			}
			if f.status != want || !bytes.Equal(f.body, in.finals[0].body) {
				mismatched++
				t.Errorf("%s (%s): final %s; want %d, the same for every client (first: %s)", in.key, in.token, f, want, in.finals[0])
			}
		}
	}
	if n := queryInt(t, url, `SELECT count(*) FROM idempotency_keys WHERE state = 'processing'`); n != 0 && withoutFinal == 0 {
		t.Errorf("%d records still processing although every intent has its final answer", n)
	}

	// Zero doubles: at the acquirer, no order captured more than once (and
	// every approved intent captured once); in the database, one charge per
	// intent.
	ac := acquirerClient(acq)
	doubles := 0
	for _, in := range all {
		captured, list := capturesOf(t, ac, in.order)
		switch {
		case captured > 1:
			doubles++
			t.Errorf("order %d (%s) captured %d times: %+v", in.order, in.token, captured, list)
		case in.token != "tok_declined" && captured != 1 && len(in.finals) > 0 && in.finals[0].final():
			t.Errorf("order %d (%s) answered %d but captured %d times", in.order, in.token, in.finals[0].status, captured)
		}
	}
	var storedDoubles, storedCaptured, storedCharges int64
	db(t, url, func(conn *pgx.Conn) error {
		return conn.QueryRow(t.Context(), `
SELECT (SELECT count(*) FROM (SELECT order_id FROM charges GROUP BY merchant_id, order_id HAVING count(*) > 1) d),
       (SELECT count(*) FROM charges WHERE status = 'captured'),
       (SELECT count(*) FROM charges)`).Scan(&storedDoubles, &storedCaptured, &storedCharges)
	})
	doubles += int(storedDoubles)
	st, err := ac.Stats(t.Context())
	if err != nil {
		t.Fatal(err)
	}

	t.Logf("soak: %d intents (%d approved, %d submitted twice at once) over %d instances in %v; instance 0 killed at %v, back at %v",
		intents, approved, dups, instances, elapsed.Round(time.Millisecond), killedAt.Round(time.Millisecond), restartedAt.Round(time.Millisecond))
	t.Logf("soak: %d attempts: %d client timeouts, %d broken or refused connections, %d answered 202, %d answered 409, %d answered 5xx",
		attempts.Load(), timeouts.Load(), refused.Load(), pending.Load(), conflicts.Load(), serverErrs.Load())
	t.Logf("soak: acquirer %d requests, %d duplicate requests; database %d charges", st.CaptureRequests, st.DuplicateRequests, storedCharges)
	t.Logf("soak: doubles=%d intents_without_final_answer=%d acquirer_captures=%d stored_captured_charges=%d",
		doubles, withoutFinal, st.Captures, storedCaptured)

	if doubles != 0 {
		t.Errorf("%d doubles", doubles)
	}
	if withoutFinal != 0 || mismatched != 0 {
		t.Errorf("%d answers missing, %d final answers wrong", withoutFinal, mismatched)
	}
	if st.Captures != storedCaptured || st.Captures != int64(approved) {
		t.Errorf("acquirer captures %d, stored captured charges %d, approved intents %d: want all equal", st.Captures, storedCaptured, approved)
	}
	if storedCharges != intents {
		t.Errorf("%d charges stored for %d intents", storedCharges, intents)
	}
	if timeouts.Load() == 0 || pending.Load() == 0 {
		t.Errorf("the soak exercised no client timeout or no unknown outcome: the faults did not happen")
	}
}

// isTimeout reports whether a client error is its own timeout.
func isTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}
