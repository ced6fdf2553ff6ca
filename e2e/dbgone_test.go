package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/client"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/internal/pgtest"
)

// The database goes away mid-storm, on a server of the test's own: crashed
// (pg_ctl stop -m immediate) and restarted, or failed over to a synchronous
// standby. Real `chargeonce serve` processes, the stand-alone acquirer, and
// the Go client as the storm. Either way: every intent settles once
// (acquirer captures == approved intents, one capture per approved intent,
// under its charge id), no charge a client was told about (201 or 402) is
// lost, and no attempt is answered 500: the service says 503 unavailable,
// with Retry-After, and the client's retries with the same key finish the
// job.

// dbGoneFlags make leases and recovery quick enough for a bounded test.
var dbGoneFlags = []string{"--lease", "2s", "--acquirer-timeout", "1s", "--reconcile-every", "200ms"}

// TestDatabaseCrashMidStorm: PostgreSQL is stopped with pg_ctl stop -m
// immediate one second into the storm and started again 1.5 s later.
func TestDatabaseCrashMidStorm(t *testing.T) {
	t.Parallel()
	srv := pgtest.NewServer(t)
	ps := newProcs(t)
	acq := ps.startAcquirer("acquirer")
	a := ps.start("serve-a", serveArgs(srv.URL(), acq.URL(), dbGoneFlags...)...)
	b := ps.start("serve-b", serveArgs(srv.URL(), acq.URL(), dbGoneFlags...)...)
	bases := []string{a.URL(), b.URL()}

	res := storm(t, bases, 4*time.Second, time.Second, func() {
		srv.Crash()
		t.Logf("PostgreSQL crashed (pg_ctl stop -m immediate)")
		time.Sleep(1500 * time.Millisecond)
		srv.Start()
		t.Logf("PostgreSQL restarted")
	})
	res.check(t, srv.URL(), acquirerClient(acq))
	if t.Failed() {
		t.Log(srv.Log())
	}
}

// TestFailoverToSyncStandby: the primary of a pair with a synchronous
// standby is crashed one second into the storm and the standby promoted;
// `serve` runs on a multi-host --db with target_session_attrs=read-write
// (standby listed first), and its pool finds the new primary by itself.
func TestFailoverToSyncStandby(t *testing.T) {
	t.Parallel()
	pair := pgtest.NewPair(t)
	ps := newProcs(t)
	acq := ps.startAcquirer("acquirer")
	a := ps.start("serve-a", serveArgs(pair.URL(), acq.URL(), dbGoneFlags...)...)
	b := ps.start("serve-b", serveArgs(pair.URL(), acq.URL(), dbGoneFlags...)...)
	bases := []string{a.URL(), b.URL()}

	var failedOver time.Time
	res := storm(t, bases, 4*time.Second, time.Second, func() {
		pair.Failover()
		failedOver = time.Now()
		t.Logf("primary crashed, standby promoted")
	})
	// The instances reconnected to the promoted standby by themselves:
	// intents begun after the failover were charged, and both are ready.
	after := 0
	for _, in := range res.intents {
		if in.began.After(failedOver) && in.status == 201 {
			after++
		}
	}
	if after == 0 {
		t.Errorf("no intent begun after the failover was charged")
	}
	for _, base := range bases {
		apitest.Eventually(t, 10*time.Second, base+"/readyz to answer 200 after the failover", func() bool {
			resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(base + "/readyz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == 200
		})
	}
	var port int
	db(t, pair.URL(), func(conn *pgx.Conn) error {
		return conn.QueryRow(t.Context(), `SELECT inet_server_port()`).Scan(&port)
	})
	if port != pair.Standby.Port() {
		t.Fatalf("the pair's URL reaches port %d; want the promoted standby's %d", port, pair.Standby.Port())
	}
	// Read from the promoted standby: what the clients were told is there.
	res.check(t, pair.Standby.URL(), acquirerClient(acq))
	t.Logf("%d intents charged after the failover", after)
	if t.Failed() {
		t.Logf("primary:\n%s\nstandby:\n%s", pair.Primary.Log(), pair.Standby.Log())
	}
}

// stormWorkers is how many clients run at once.
const stormWorkers = 8

// intent is one payment intent of the storm and the final answer its
// client got.
type intent struct {
	order    int64
	key      string
	token    string
	began    time.Time
	ended    time.Time
	status   int // 201 or 402; 0 when the client got none
	chargeID string
	err      error
}

// stormResult is what the clients saw.
type stormResult struct {
	mu       sync.Mutex
	intents  []*intent
	statuses map[int]int // every attempt's status
	noAnswer int         // attempts without an answer
	// spanning counts the intents in flight when the fault struck: begun
	// before it, answered after.
	spanning int
}

// storm runs stormWorkers clients, each charging new intents one after the
// other (one in four declined) on the instances in turn, for d, and runs
// fault after faultAt. Every intent runs to its final answer (the clients
// retry with the same key for up to 45 s).
func storm(t *testing.T, bases []string, d, faultAt time.Duration, fault func()) *stormResult {
	t.Helper()
	res := &stormResult{statuses: map[int]int{}}
	hook := client.WithAttemptHook(func(a client.Attempt) {
		res.mu.Lock()
		defer res.mu.Unlock()
		if a.Status == 0 {
			res.noAnswer++
			return
		}
		res.statuses[a.Status]++
	})
	var clients []*client.Client
	for _, base := range bases {
		c := client.New(base, apitest.APIKey, hook,
			client.WithBackoff(20*time.Millisecond, 500*time.Millisecond),
			client.WithRetryFor(45*time.Second), client.WithAttemptTimeout(10*time.Second))
		t.Cleanup(c.CloseIdleConnections)
		clients = append(clients, c)
	}
	start := time.Now()
	faultDone := make(chan struct{})
	var faultBegan time.Time
	go func() {
		defer close(faultDone)
		time.Sleep(faultAt)
		faultBegan = time.Now()
		fault()
	}()
	var wg sync.WaitGroup
	for w := range stormWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Since(start) < d; i++ {
				in := &intent{order: newOrder(), key: uniqueName(fmt.Sprintf("storm-%d-", w)), token: "tok_ok", began: time.Now()}
				if (w+i)%4 == 0 {
					in.token = "tok_declined"
				}
				c := clients[(w+i)%len(clients)]
				ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
				ch, err := c.CreateCharge(ctx, client.ChargeRequest{
					OrderID: in.order, AmountCents: 2500, Currency: "BRL", PaymentToken: in.token, IdempotencyKey: in.key,
				})
				cancel()
				in.ended = time.Now()
				var declined *client.DeclinedError
				switch {
				case err == nil:
					in.status, in.chargeID = 201, ch.ID
				case errors.As(err, &declined):
					in.status, in.chargeID = 402, declined.ChargeID
				default:
					in.err = err
				}
				res.mu.Lock()
				res.intents = append(res.intents, in)
				res.mu.Unlock()
			}
		}()
	}
	wg.Wait()
	<-faultDone
	for _, in := range res.intents {
		if in.began.Before(faultBegan) && in.ended.After(faultBegan) {
			res.spanning++
		}
	}
	return res
}

// check wants every intent final, no 500, some 503 (the fault struck
// mid-storm), every told charge in the database (at dbURL) with its
// status, and the acquirer's captures to match the approved intents one for
// one.
func (r *stormResult) check(t *testing.T, dbURL string, acq *acquirer.Client) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	approved, declined := 0, 0
	for _, in := range r.intents {
		switch {
		case in.err != nil:
			t.Errorf("intent %s (%s): no final answer: %v", in.key, in.token, in.err)
		case in.status == 201 && in.token != "tok_ok", in.status == 402 && in.token != "tok_declined":
			t.Errorf("intent %s (%s) answered %d", in.key, in.token, in.status)
		case in.status == 201:
			approved++
		default:
			declined++
		}
	}
	t.Logf("%d intents: %d approved, %d declined; attempts answered %v (500: %d, 503: %d), %d without an answer; %d intents in flight when the fault struck",
		len(r.intents), approved, declined, r.statuses, r.statuses[500], r.statuses[503], r.noAnswer, r.spanning)
	if n := r.statuses[500]; n != 0 {
		t.Errorf("%d attempts answered 500; a database outage must be 503", n)
	}
	// Proof that the fault struck mid-storm: an attempt was told 503, or
	// lost its answer (its connection went down with the database's), or
	// an intent was in flight when it struck (the service rode it out: a
	// write retried onto the promoted standby answers 201).
	if r.statuses[503] == 0 && r.noAnswer == 0 && r.spanning == 0 {
		t.Errorf("no attempt answered 503 or lost its answer, and no intent was in flight when it struck: the fault did not strike mid-storm")
	}

	// Every charge a client was told about is in the database, with the
	// status it was told, and no order has a second charge.
	stored := map[string]string{}
	perOrder := map[int64]int{}
	db(t, dbURL, func(conn *pgx.Conn) error {
		rows, err := conn.Query(t.Context(), `SELECT id, order_id, status FROM charges`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var id, status string
			var order int64
			if err := rows.Scan(&id, &order, &status); err != nil {
				return err
			}
			stored[id] = status
			perOrder[order]++
		}
		return rows.Err()
	})
	for _, in := range r.intents {
		if in.status == 0 {
			continue
		}
		want := map[int]string{201: "captured", 402: "declined"}[in.status]
		if got, ok := stored[in.chargeID]; !ok || got != want {
			t.Errorf("intent %s was told %d for charge %s; the database holds %q (found %v)", in.key, in.status, in.chargeID, got, ok)
		}
		if perOrder[in.order] != 1 {
			t.Errorf("order %d has %d charges; want 1", in.order, perOrder[in.order])
		}
	}

	// The acquirer moved money once per approved intent, under its charge.
	st, err := acq.Stats(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.Captures != int64(approved) {
		t.Errorf("the acquirer captured %d times for %d approved intents", st.Captures, approved)
	}
	for _, in := range r.intents {
		if in.status == 201 {
			wantOneCapture(t, acq, in.order, in.chargeID)
		}
	}
	t.Logf("acquirer: %d capture requests, %d captures, %d duplicate requests (re-drives by the same reference)",
		st.CaptureRequests, st.Captures, st.DuplicateRequests)
}
