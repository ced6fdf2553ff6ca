package e2e

import (
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/internal/pgtest"
)

// chargeObject is the part of a charge object the tests read.
type chargeObject struct {
	ID      string `json:"id"`
	OrderID int64  `json:"order_id"`
	Status  string `json:"status"`
}

func decodeCharge(t *testing.T, body []byte) chargeObject {
	t.Helper()
	var c chargeObject
	if err := json.Unmarshal(body, &c); err != nil || c.ID == "" {
		t.Fatalf("not a charge object: %s (%v)", body, err)
	}
	return c
}

// listCharges returns the merchant's stored charges of an order through
// GET /v1/charges?order_id=N.
func listCharges(t *testing.T, base string, order int64) []chargeObject {
	t.Helper()
	r, err := apitest.Do(t, &http.Client{Timeout: 10 * time.Second}, "GET", base+"/v1/charges?order_id="+strconv.FormatInt(order, 10), nil, nil)
	if err != nil || r.Status != 200 {
		t.Fatalf("GET /v1/charges?order_id=%d: %d %s, %v", order, r.Status, r.Body, err)
	}
	var list struct{ Data []chargeObject }
	if err := json.Unmarshal(r.Body, &list); err != nil {
		t.Fatalf("decoding charges: %v", err)
	}
	return list.Data
}

// TestCrashDuringSlowAcquirerCall: three serve processes share one
// PostgreSQL database and a stand-alone acquirer. Instance A is killed with
// SIGKILL while its attempt waits for a slow capture. Retrying the same key
// on instance B ends with the stored 201, which every instance then replays
// byte for byte, and the acquirer holds exactly one capture.
func TestCrashDuringSlowAcquirerCall(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	ps := newProcs(t)
	// The capture is slow enough that the kill lands inside it even on a
	// loaded machine.
	acq := ps.startAcquirer("acquirer", "--slow", "4s")
	// The lease outlives the acquirer timeout, which outlives the slow
	// capture: the crash, not a timeout, is what leaves the record behind.
	flags := []string{"--lease", "6s", "--acquirer-timeout", "4500ms", "--reconcile-every", "200ms"}
	dbURL := withParams(url, "pool_max_conns", "4")
	a := ps.start("serve-a", serveArgs(dbURL, acq.URL(), flags...)...)
	b := ps.start("serve-b", serveArgs(dbURL, acq.URL(), flags...)...)
	c := ps.start("serve-c", serveArgs(dbURL, acq.URL(), flags...)...)
	ac := acquirerClient(acq)

	order := newOrder()
	key := uniqueName("crash-")
	body := chargeBody(order, "tok_slow")
	first := make(chan answer, 1)
	start := time.Now()
	go func() { first <- charge(&http.Client{Timeout: 30 * time.Second}, a.URL(), key, body) }()

	// The attempt is at the acquirer once its request has arrived there.
	apitest.Eventually(t, 20*time.Second, "the capture request to reach the acquirer", func() bool {
		st, err := ac.Stats(t.Context())
		return err == nil && st.CaptureRequests >= 1
	})
	a.kill()
	killed := time.Since(start)
	if list, err := ac.ListByOrder(t.Context(), order, "demo"); err != nil || len(list) != 0 {
		t.Fatalf("the capture had already settled when A was killed (%v, %v): the crash did not happen mid-call", list, err)
	}
	if got := <-first; got.err == nil {
		t.Fatalf("the killed instance answered %s", got)
	}

	final, trail := untilFinal(t, 60*time.Second, func() []string { return []string{b.URL()} }, key, body)
	settled := time.Since(start)
	if final.status != 201 {
		t.Fatalf("final answer %s, want 201", final)
	}
	ch := decodeCharge(t, final.body)
	if ch.Status != "captured" || ch.OrderID != order {
		t.Fatalf("final charge %+v, want order %d captured", ch, order)
	}
	// Every retry before it was told to come back later (409), or that the
	// outcome is not known yet (202); untilFinal fails on anything else.
	wantReplays(t, []string{b.URL(), c.URL(), b.URL()}, key, body, final)
	wantOneCapture(t, ac, order, ch.ID)
	st, err := ac.Stats(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// B looked the reference up before re-driving it and settled from the
	// capture A's request made: the reference was sent once.
	if st.Captures != 1 || st.CaptureRequests != 1 {
		t.Fatalf("acquirer stats %+v; want one capture request and one capture, the re-drive settled by looking the reference up", st)
	}
	if list := listCharges(t, c.URL(), order); len(list) != 1 || list[0].ID != ch.ID || list[0].Status != "captured" {
		t.Fatalf("stored charges of the order: %+v; want the one captured charge", list)
	}
	t.Logf("A killed %v after the POST; final 201 on B %v after the POST, after %d earlier answers %v; acquirer %+v",
		killed.Round(time.Millisecond), settled.Round(time.Millisecond), len(trail), statuses(trail), st)
}

// statuses summarises a trail of answers.
func statuses(trail []answer) []string {
	var out []string
	for _, a := range trail {
		if a.err != nil {
			out = append(out, "error")
			continue
		}
		out = append(out, strconv.Itoa(a.status))
	}
	return out
}
