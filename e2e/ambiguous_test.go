package e2e

import (
	"net/http"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/internal/pgtest"
)

// TestInsertCommittedButAnswerLost: the insert that records an intent
// commits on the server, but its acknowledgement never reaches the instance
// (a proxy cuts the connection right after the commit), and for a second
// every new connection fails too, so the release of the key fails as well.
// The instance cannot know whether the record exists: it must answer 503
// unavailable with Retry-After (never 500, which would suggest a bug and
// that nothing happened), and the client's retries with the same key end
// with exactly one capture.
func TestInsertCommittedButAnswerLost(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	ps := newProcs(t)
	acq := ps.startAcquirer("acquirer")
	key := uniqueName("cut-after-commit-")
	proxy, viaProxy := startPGProxy(t, url, key, time.Second)
	flags := []string{"--lease", "2s", "--acquirer-timeout", "1s", "--reconcile-every", "200ms"}
	a := ps.start("serve-a", serveArgs(withParams(viaProxy, "pool_max_conns", "4"), acq.URL(), flags...)...)
	ac := acquirerClient(acq)

	order := newOrder()
	body := chargeBody(order, "tok_ok")
	first := charge(&http.Client{Timeout: 30 * time.Second}, a.URL(), key, body)
	if proxy.cutCount() != 1 {
		t.Fatalf("the proxy cut %d statements; want the insert's", proxy.cutCount())
	}
	if first.err != nil || first.status != 503 || first.header.Get("Retry-After") == "" {
		t.Fatalf("first answer %s (Retry-After %q); want 503 unavailable with Retry-After: the insert may have committed",
			first, first.header.Get("Retry-After"))
	}
	if n := queryInt(t, url, `SELECT count(*) FROM idempotency_keys WHERE key = $1`, key); n != 1 {
		t.Fatalf("%d records for the key; want the committed one (did the release get through?)", n)
	}

	final, trail := untilFinal(t, 30*time.Second, func() []string { return []string{a.URL()} }, key, body)
	for _, ans := range trail {
		if ans.err == nil && ans.status == 500 {
			t.Fatalf("a retry answered 500: %s", ans)
		}
		if ans.err == nil && ans.status == 503 && ans.header.Get("Retry-After") == "" {
			t.Fatalf("503 without Retry-After: %s", ans)
		}
	}
	if final.status != 201 {
		t.Fatalf("final %s; want 201", final)
	}
	ch := decodeCharge(t, final.body)
	wantReplays(t, []string{a.URL()}, key, body, final)
	wantOneCapture(t, ac, order, ch.ID)
	if n := queryInt(t, url, `SELECT count(*) FROM charges WHERE order_id = $1`, order); n != 1 {
		t.Fatalf("%d charges for the order; want 1", n)
	}
	t.Logf("insert committed, answer cut: first 503, then %v, then 201; 1 capture", statuses(trail))
}
