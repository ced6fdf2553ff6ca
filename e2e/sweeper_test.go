package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/internal/pgtest"
)

// TestKeyExpiry: a serve process with a short --key-ttl. Its sweeper
// deletes the idempotency record once it expires and keeps the charge
// (still readable through the API); the same key used again afterwards is a
// new intent: a new charge, a fresh 201 rather than a replay, and a second
// capture at the acquirer, as documented for clients.
func TestKeyExpiry(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	ps := newProcs(t)
	// The in-process simulator, whose API serve mounts under /acquirer. The
	// replays below must come within the key TTL, on a loaded machine too.
	s := ps.start("serve", "serve", "--addr", "127.0.0.1:0", "--db", url, "--acquirer", "sim",
		"--key-ttl", "5s", "--sweep-every", "200ms")
	acq := acquirer.NewClient(s.URL()+"/acquirer", &http.Client{Timeout: 10 * time.Second})
	c := &http.Client{Timeout: 10 * time.Second}
	order := newOrder()
	key := uniqueName("expiring-")
	body := chargeBody(order, "tok_ok")

	first := charge(c, s.URL(), key, body)
	if first.err != nil || first.status != 201 {
		t.Fatalf("first answer %s; want 201", first)
	}
	old := decodeCharge(t, first.body)
	wantReplays(t, []string{s.URL()}, key, body, first)

	records := func() int64 { return queryInt(t, url, `SELECT count(*) FROM idempotency_keys WHERE key = $1`, key) }
	if records() != 1 {
		t.Fatalf("no idempotency record for %s", key)
	}
	apitest.Eventually(t, 30*time.Second, "the sweeper to delete the expired record", func() bool { return records() == 0 })
	// The sweeper logs once its DELETE has returned, a moment after the
	// deletion is visible here.
	apitest.Eventually(t, 5*time.Second, "the sweeper to log its deletion", func() bool {
		return strings.Contains(s.logText(), `msg="expired idempotency keys deleted" deleted=1`)
	})
	// The charge outlives its key.
	r, err := apitest.Do(t, c, "GET", s.URL()+"/v1/charges/"+old.ID, nil, nil)
	if err != nil || r.Status != 200 || decodeCharge(t, r.Body).Status != "captured" {
		t.Fatalf("GET the old charge after its key expired: %d %s, %v; want 200 captured", r.Status, r.Body, err)
	}

	again := charge(c, s.URL(), key, body)
	if again.err != nil || again.status != 201 || again.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("reuse after expiry: %s (Idempotent-Replayed %q); want a fresh 201", again, again.header.Get("Idempotent-Replayed"))
	}
	fresh := decodeCharge(t, again.body)
	if fresh.ID == old.ID {
		t.Fatalf("reuse after expiry answered the old charge %s", old.ID)
	}
	list := listCharges(t, s.URL(), order)
	if len(list) != 2 || list[0].ID != fresh.ID || list[1].ID != old.ID {
		t.Fatalf("charges of the order: %+v; want the new one and the old one, newest first", list)
	}
	captures, err := acq.ListByOrder(t.Context(), order, "demo")
	if err != nil || len(captures) != 2 || captures[0].Reference != old.ID || captures[1].Reference != fresh.ID {
		t.Fatalf("acquirer captures of the order: %+v, %v; want one per intent", captures, err)
	}
	// The new intent replays like any other.
	wantReplays(t, []string{s.URL()}, key, body, again)
	t.Logf("key swept and reused: charge %s, then charge %s", old.ID, fresh.ID)
}
