package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/internal/pgtest"
	"github.com/chargeonce/chargeonce/webhook"
)

// stormReceiver is a merchant's webhook endpoint on loopback: it verifies
// every delivery with the Standard Webhooks library and keeps every copy.
// The first delivery of every tenth event is answered 503, so retries are
// part of the storm.
type stormReceiver struct {
	mu       sync.Mutex
	wh       *standardwebhooks.Webhook
	copies   map[string][]stormCopy // webhook-id -> every copy received
	bad      []string
	refused  atomic.Int64
	received atomic.Int64
}

type stormCopy struct {
	at     time.Time
	body   []byte
	status int
}

func (r *stormReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	id := req.Header.Get("webhook-id")
	r.mu.Lock()
	defer r.mu.Unlock()
	r.received.Add(1)
	if r.wh == nil || r.wh.Verify(body, req.Header) != nil {
		r.bad = append(r.bad, fmt.Sprintf("%s: signature %q does not verify", id, req.Header.Get("webhook-signature")))
		w.WriteHeader(400)
		return
	}
	var ev struct{ ID string }
	if json.Unmarshal(body, &ev) != nil || ev.ID != id {
		r.bad = append(r.bad, fmt.Sprintf("%s: body id %q", id, ev.ID))
	}
	status := 200
	if len(r.copies[id]) == 0 && len(r.copies)%10 == 0 {
		status = 503
		r.refused.Add(1)
	}
	r.copies[id] = append(r.copies[id], stormCopy{at: time.Now(), body: body, status: status})
	w.WriteHeader(status)
}

// TestWebhookStorm settles 300 intents on three instances, a third of them
// through 202 and recovery (tok_fail_after: the acquirer captures and its
// answer is lost), and SIGKILLs one instance mid-storm. Every settled
// intent's event reaches the merchant's endpoint at least once, with a valid
// signature and one webhook-id on every copy; the event's charge is what
// GET /v1/charges/{id} says; intents that have not settled (a capture still
// under way) have no event.
func TestWebhookStorm(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	ps := newProcs(t)
	acq := ps.startAcquirer("acquirer", "--slow", "10m")
	recv := &stormReceiver{copies: map[string][]stormCopy{}}
	rs := httptest.NewServer(recv)
	t.Cleanup(rs.Close)

	flags := []string{"--lease", "2s", "--acquirer-timeout", "1500ms", "--reconcile-every", "200ms",
		"--webhooks-allow-private", "--webhooks-schedule-scale", "0.001", "--webhooks-every", "100ms"}
	dbURL := withParams(url, "pool_max_conns", "8")
	a := ps.start("serve-a", serveArgs(dbURL, acq.URL(), flags...)...)
	b := ps.start("serve-b", serveArgs(dbURL, acq.URL(), flags...)...)
	c := ps.start("serve-c", serveArgs(dbURL, acq.URL(), flags...)...)

	r, err := apitest.Do(t, nil, "POST", a.URL()+"/v1/webhook_endpoints", []byte(fmt.Sprintf(`{"url":%q}`, rs.URL+"/hooks")), nil)
	if err != nil || r.Status != 201 {
		t.Fatalf("creating the endpoint: %v %d %s", err, r.Status, r.Body)
	}
	var ep struct{ Secret string }
	if err := json.Unmarshal(r.Body, &ep); err != nil {
		t.Fatal(err)
	}
	wh, err := standardwebhooks.NewWebhook(ep.Secret)
	if err != nil {
		t.Fatal(err)
	}
	recv.mu.Lock()
	recv.wh = wh
	recv.mu.Unlock()

	type intent struct {
		key   string
		body  []byte
		token string
		first answer
	}
	const n = 300
	intents := make([]*intent, n)
	for i := range intents {
		token := "tok_ok"
		switch {
		case i%3 == 0:
			token = "tok_fail_after"
		case i%7 == 1:
			token = "tok_declined"
		}
		intents[i] = &intent{key: uniqueName("storm-"), body: chargeBody(newOrder(), token), token: token}
	}
	// Five intents that cannot settle during the test: their capture is
	// still under way at the acquirer (--slow 10m).
	var stuck []*intent
	for range 5 {
		stuck = append(stuck, &intent{key: uniqueName("stuck-"), body: chargeBody(newOrder(), "tok_slow")})
	}

	var (
		killed atomic.Bool
		sent   atomic.Int64
		wg     sync.WaitGroup
		next   atomic.Int64
	)
	live := func() []string {
		if killed.Load() {
			return []string{a.URL(), c.URL()}
		}
		return []string{a.URL(), b.URL(), c.URL()}
	}
	client := &http.Client{Timeout: 10 * time.Second}
	start := time.Now()
	for w := range 12 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if i == n/3 && killed.CompareAndSwap(false, true) {
					b.kill()
				}
				bs := live()
				in := intents[i]
				in.first = charge(client, bs[(i+w)%len(bs)], in.key, in.body)
				sent.Add(1)
			}
		})
	}
	for _, in := range stuck {
		wg.Go(func() { in.first = charge(client, a.URL(), in.key, in.body) })
	}
	wg.Wait()
	t.Logf("%d intents sent in %s; serve-b SIGKILLed after %d", sent.Load(), time.Since(start).Round(time.Millisecond), n/3)

	// Every intent settles (recovery re-drives the 202s on the living
	// instances), and its final answer names its charge.
	settled := map[string]*intent{} // charge id -> intent
	via202 := 0
	for _, in := range intents {
		final, trail := untilFinal(t, 120*time.Second, live, in.key, in.body)
		if in.first.status == 202 || in.first.err != nil || len(trail) > 0 {
			via202++
		}
		var ch struct{ ID string }
		if final.status == 201 {
			_ = json.Unmarshal(final.body, &ch)
		} else {
			var p struct {
				ChargeID string `json:"charge_id"`
			}
			_ = json.Unmarshal(final.body, &p)
			ch.ID = p.ChargeID
		}
		if ch.ID == "" {
			t.Fatalf("%s: final answer %s names no charge", in.key, final)
		}
		settled[ch.ID] = in
	}
	var stuckIDs []string
	for _, in := range stuck {
		lst := listChargesOf(t, a.URL(), in.body)
		if len(lst) != 1 || lst[0].Status != "processing" {
			t.Fatalf("stuck intent %s: charges %+v, want one processing", in.key, lst)
		}
		stuckIDs = append(stuckIDs, lst[0].ID)
	}

	// Every settled charge's event arrives.
	eventOf := func(chargeID string) string { return "evt_" + chargeID[3:] }
	apitest.Eventually(t, 120*time.Second, "an event for every settled intent", func() bool {
		recv.mu.Lock()
		defer recv.mu.Unlock()
		for id := range settled {
			cs := recv.copies[eventOf(id)]
			if !slices.ContainsFunc(cs, func(c stormCopy) bool { return c.status == 200 }) {
				return false
			}
		}
		return true
	})
	time.Sleep(time.Second) // late duplicates, and any event for a stuck intent

	recv.mu.Lock()
	defer recv.mu.Unlock()
	if len(recv.bad) > 0 {
		t.Fatalf("%d deliveries failed verification: %v", len(recv.bad), recv.bad[:min(5, len(recv.bad))])
	}
	var (
		copies    int
		dups      int
		latencies []time.Duration
	)
	for id, cs := range recv.copies {
		copies += len(cs)
		var ev webhook.Event
		if err := json.Unmarshal(cs[0].body, &ev); err != nil {
			t.Fatalf("event %s: %v", id, err)
		}
		var obj struct{ ID, Status string }
		_ = json.Unmarshal(ev.Data.Object, &obj)
		if _, ok := settled[obj.ID]; !ok {
			t.Fatalf("event %s for charge %s, which is not one of the settled intents'", id, obj.ID)
		}
		if eventOf(obj.ID) != id || ev.Type != "charge."+obj.Status {
			t.Fatalf("event %s (%s) for charge %s (%s)", id, ev.Type, obj.ID, obj.Status)
		}
		for _, c := range cs[1:] {
			if !bytes.Equal(c.body, cs[0].body) {
				t.Fatalf("two copies of %s differ:\n%s\n%s", id, cs[0].body, c.body)
			}
		}
		got, err := apitest.Do(t, nil, "GET", a.URL()+"/v1/charges/"+obj.ID, nil, nil)
		if err != nil || got.Status != 200 || !bytes.Equal(got.Body, ev.Data.Object) {
			t.Fatalf("event %s's charge %s, GET /v1/charges/{id} says %d %s", id, ev.Data.Object, got.Status, got.Body)
		}
		oks := 0
		for _, c := range cs {
			if c.status == 200 {
				if oks == 0 {
					latencies = append(latencies, c.at.Sub(ev.CreatedAt))
				}
				oks++
			}
		}
		dups += max(0, oks-1)
	}
	if len(recv.copies) != len(settled) {
		t.Fatalf("%d events delivered for %d settled intents", len(recv.copies), len(settled))
	}
	for _, id := range stuckIDs {
		if _, ok := recv.copies[eventOf(id)]; ok {
			t.Fatalf("an event for charge %s, which has not settled", id)
		}
	}
	slices.Sort(latencies)
	pct := func(p float64) time.Duration {
		return latencies[int(p*float64(len(latencies)-1))].Round(time.Millisecond)
	}
	t.Logf("%d settled intents (%d through 202/retries), %d events, %d deliveries received (%d answered 503 on purpose, %d duplicate 2xx copies); settlement -> first 2xx p50 %s p99 %s max %s",
		len(settled), via202, len(recv.copies), copies, recv.refused.Load(), dups, pct(0.5), pct(0.99), pct(1))
}

// listChargesOf lists the charges of the order in a charge request body.
func listChargesOf(t *testing.T, base string, body []byte) []chargeObject {
	t.Helper()
	var req struct {
		OrderID int64 `json:"order_id"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		t.Fatal(err)
	}
	return listCharges(t, base, req.OrderID)
}
