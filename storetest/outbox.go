package storetest

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
)

// outboxTests are the outbox's part of the suite (the queue's transactional
// outbox: KeyNotify, OutboxClaim, OutboxMarkSent, OutboxStats).
var outboxTests = []struct {
	name string
	fn   func(t *testing.T, s chargeonce.Store)
}{
	{"OutboxNotifiedCompletionWritten", testOutboxNotifiedCompletionWritten},
	{"OutboxOnlyWhenNotified", testOutboxOnlyWhenNotified},
	{"OutboxCompletedByRecovery", testOutboxCompletedByRecovery},
	{"OutboxNotifyRacesComplete", testOutboxNotifyRacesComplete},
	{"OutboxClaimConcurrentOnce", testOutboxClaimConcurrentOnce},
	{"OutboxClaimEndsReissued", testOutboxClaimEndsReissued},
	{"OutboxReleaseKeepsNotify", testOutboxReleaseKeepsNotify},
}

// claimAll claims every entry available now.
func claimAll(t *testing.T, s chargeonce.Store, lease time.Duration) []chargeonce.OutboxEntry {
	t.Helper()
	es, err := s.OutboxClaim(t.Context(), lease, 1000)
	if err != nil {
		t.Fatalf("OutboxClaim: %v", err)
	}
	return es
}

func notify(t *testing.T, s chargeonce.Store, merchant, key string) bool {
	t.Helper()
	flagged, err := s.KeyNotify(t.Context(), merchant, key)
	if err != nil {
		t.Fatalf("KeyNotify(%s/%s): %v", merchant, key, err)
	}
	return flagged
}

func testOutboxNotifiedCompletionWritten(t *testing.T, s chargeonce.Store) {
	p := newIntent("m1", "key-1")
	insert(t, s, p)
	if !notify(t, s, "m1", "key-1") {
		t.Fatal("KeyNotify of a processing record: flagged=false")
	}
	if es := claimAll(t, s, longLease); len(es) != 0 {
		t.Fatalf("outbox holds %d entries before the record completed", len(es))
	}
	body := []byte(`{"id":"ch_x","status":"captured"}` + "\n\x00\xff")
	complete(t, s, "m1", "key-1", p.Token, body)

	st, err := s.OutboxStats(t.Context())
	if err != nil || st.Count != 1 || st.OldestAge < 0 || st.OldestAge > time.Minute {
		t.Fatalf("OutboxStats = %+v, %v; want 1 entry, young", st, err)
	}
	es := claimAll(t, s, longLease)
	if len(es) != 1 {
		t.Fatalf("outbox holds %d entries after the completion, want 1", len(es))
	}
	e := es[0]
	if e.MerchantID != "m1" || e.Key != "key-1" || e.ResponseStatus != 201 || !bytes.Equal(e.ResponseBody, body) || e.CreatedAt.IsZero() {
		t.Fatalf("outbox entry = %+v, want m1/key-1 201 with the stored bytes", e)
	}
	// Held: a second publisher gets nothing.
	if es := claimAll(t, s, longLease); len(es) != 0 {
		t.Fatalf("a held entry was claimed again: %+v", es)
	}
	if err := s.OutboxMarkSent(t.Context(), []int64{e.ID, e.ID + 1000}); err != nil {
		t.Fatalf("OutboxMarkSent: %v", err)
	}
	if st, err := s.OutboxStats(t.Context()); err != nil || st.Count != 0 || st.OldestAge != 0 {
		t.Fatalf("OutboxStats after sending = %+v, %v; want empty", st, err)
	}
	if err := s.OutboxMarkSent(t.Context(), nil); err != nil {
		t.Fatalf("OutboxMarkSent(nil): %v", err)
	}
	// A completed record is not flagged again: its answer is read instead.
	if notify(t, s, "m1", "key-1") {
		t.Fatal("KeyNotify of a completed record: flagged=true")
	}
	if notify(t, s, "m1", "no-such-key") {
		t.Fatal("KeyNotify of a missing record: flagged=true")
	}
}

func testOutboxOnlyWhenNotified(t *testing.T, s chargeonce.Store) {
	// An HTTP-only intent never touches the outbox.
	p := newIntent("m1", "http-only")
	insert(t, s, p)
	complete(t, s, "m1", "http-only", p.Token, []byte(`{}`))
	// Flags are per merchant and key.
	q := newIntent("m2", "http-only")
	insert(t, s, q)
	if !notify(t, s, "m2", "http-only") {
		t.Fatal("KeyNotify: flagged=false")
	}
	if es := claimAll(t, s, longLease); len(es) != 0 {
		t.Fatalf("outbox holds %+v; want nothing", es)
	}
	// A lease change or a failed (stale) completion writes nothing either.
	if err := s.KeyLeaseSet(t.Context(), "m2", "http-only", q.Token, 0, true); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "stale KeyComplete", s.KeyComplete(t.Context(), chargeonce.KeyCompleteParams{
		MerchantID: "m2", Key: "http-only", Token: "intruder",
		ChargeStatus: chargeonce.StatusCaptured, ResponseStatus: 201, ResponseBody: []byte("{}"),
	}), chargeonce.ESTALE)
	if st, err := s.OutboxStats(t.Context()); err != nil || st.Count != 0 {
		t.Fatalf("OutboxStats = %+v, %v; want empty", st, err)
	}
}

func testOutboxCompletedByRecovery(t *testing.T, s chargeonce.Store) {
	p := newIntent("m1", "key-1")
	insert(t, s, p)
	if !notify(t, s, "m1", "key-1") {
		t.Fatal("KeyNotify: flagged=false")
	}
	// The attempt's outcome was unknown: it hands the record to recovery,
	// which claims it under a token of its own and stores a decline.
	if err := s.KeyLeaseSet(t.Context(), "m1", "key-1", p.Token, 0, false); err != nil {
		t.Fatal(err)
	}
	recs, err := s.KeysClaimExpired(t.Context(), longLease, 10)
	if err != nil || len(recs) != 1 {
		t.Fatalf("KeysClaimExpired = %d records, %v", len(recs), err)
	}
	body := []byte(`{"type":"card-declined"}`)
	if err := s.KeyComplete(t.Context(), chargeonce.KeyCompleteParams{
		MerchantID: "m1", Key: "key-1", Token: recs[0].Token,
		ChargeStatus: chargeonce.StatusDeclined, DeclineCode: "insufficient_funds", ResponseStatus: 402, ResponseBody: body,
	}); err != nil {
		t.Fatalf("KeyComplete by recovery: %v", err)
	}
	es := claimAll(t, s, longLease)
	if len(es) != 1 || es[0].ResponseStatus != 402 || !bytes.Equal(es[0].ResponseBody, body) {
		t.Fatalf("outbox = %+v; want recovery's 402", es)
	}
}

// testOutboxNotifyRacesComplete races KeyNotify against the completing
// write for many records: a record whose flag landed has exactly one outbox
// entry, one whose flag came too late has none (its notifier publishes the
// stored answer itself). No answer falls between the two.
func testOutboxNotifyRacesComplete(t *testing.T, s chargeonce.Store) {
	const n = 60
	tokens := make([]string, n)
	for i := range n {
		tokens[i] = insert(t, s, newIntent("m1", fmt.Sprintf("key-%d", i))).Token
	}
	flagged := make([]bool, n)
	errs := make(chan error, 2*n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		key := fmt.Sprintf("key-%d", i)
		wg.Go(func() {
			<-start
			f, err := s.KeyNotify(t.Context(), "m1", key)
			flagged[i] = f
			if err != nil {
				errs <- err
			}
		})
		wg.Go(func() {
			<-start
			if err := s.KeyComplete(t.Context(), chargeonce.KeyCompleteParams{
				MerchantID: "m1", Key: key, Token: tokens[i],
				ChargeStatus: chargeonce.StatusCaptured, ResponseStatus: 201, ResponseBody: []byte(key),
			}); err != nil {
				errs <- err
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, e := range claimAll(t, s, longLease) {
		got[e.Key]++
		if string(e.ResponseBody) != e.Key {
			t.Fatalf("entry for %s holds %q", e.Key, e.ResponseBody)
		}
	}
	nflagged := 0
	for i := range n {
		key := fmt.Sprintf("key-%d", i)
		want := 0
		if flagged[i] {
			want = 1
			nflagged++
		}
		if got[key] != want {
			t.Fatalf("%s: flagged=%v but %d outbox entries", key, flagged[i], got[key])
		}
	}
	t.Logf("%d of %d flags landed before the completion", nflagged, n)
}

// completeNotified creates n completed, notified intents.
func completeNotified(t *testing.T, s chargeonce.Store, n int) {
	t.Helper()
	for i := range n {
		key := fmt.Sprintf("key-%d", i)
		p := newIntent("m1", key)
		insert(t, s, p)
		notify(t, s, "m1", key)
		complete(t, s, "m1", key, p.Token, []byte(key))
	}
}

func testOutboxClaimConcurrentOnce(t *testing.T, s chargeonce.Store) {
	const n = 80
	completeNotified(t, s, n)
	var (
		mu   sync.Mutex
		seen = map[int64]int{}
		wg   sync.WaitGroup
		errs = make(chan error, 8)
	)
	for range 8 {
		wg.Go(func() {
			for {
				es, err := s.OutboxClaim(t.Context(), longLease, 3)
				if err != nil {
					errs <- err
					return
				}
				if len(es) == 0 {
					return
				}
				mu.Lock()
				for _, e := range es {
					seen[e.ID]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(seen) != n {
		t.Fatalf("publishers claimed %d entries, want %d", len(seen), n)
	}
	for id, c := range seen {
		if c != 1 {
			t.Fatalf("entry %d claimed %d times while held", id, c)
		}
	}
	if st, err := s.OutboxStats(t.Context()); err != nil || st.Count != n {
		t.Fatalf("OutboxStats = %+v, %v; want %d (claimed is not sent)", st, err, n)
	}
}

func testOutboxClaimEndsReissued(t *testing.T, s chargeonce.Store) {
	completeNotified(t, s, 5)
	first, err := s.OutboxClaim(t.Context(), 0, 3)
	if err != nil || len(first) != 3 {
		t.Fatalf("OutboxClaim(limit 3) = %d entries, %v", len(first), err)
	}
	for i := 1; i < len(first); i++ {
		if first[i].ID <= first[i-1].ID {
			t.Fatalf("entries not oldest first: %d after %d", first[i].ID, first[i-1].ID)
		}
	}
	// The first publisher's claim ended (it died): its entries come back.
	time.Sleep(5 * time.Millisecond)
	again := claimAll(t, s, longLease)
	if len(again) != 5 || again[0].ID != first[0].ID {
		t.Fatalf("after the claim ended: %d entries (first %v), want all 5 from %d", len(again), again, first[0].ID)
	}
}

// testOutboxReleaseKeepsNotify: a queue message was acked on the promise
// that the record's answer reaches the outbox (KeyNotify). The attempt
// owning the record then gives it up before calling the acquirer (shed,
// KeyRelease). Deleting the record would drop the promise: the retry would
// insert a fresh, unflagged record and its answer would never be published.
// So a flagged record is kept, its lease ended, for recovery or a retry to
// drive; whoever completes it writes the outbox entry.
func testOutboxReleaseKeepsNotify(t *testing.T, s chargeonce.Store) {
	p := newIntent("m1", "key-1")
	insert(t, s, p)
	if !notify(t, s, "m1", "key-1") {
		t.Fatal("KeyNotify of a processing record: flagged=false")
	}
	if err := s.KeyRelease(t.Context(), "m1", "key-1", p.Token); err != nil {
		t.Fatalf("KeyRelease of a flagged record: %v", err)
	}
	rec, err := s.KeyGet(t.Context(), "m1", "key-1")
	if err != nil {
		t.Fatalf("KeyGet after releasing a flagged record: %v; want it kept", err)
	}
	if rec.State != chargeonce.KeyProcessing || !rec.LeaseExpired {
		t.Fatalf("released flagged record: state %s, lease expired %v; want processing, expired", rec.State, rec.LeaseExpired)
	}
	if _, err := s.ChargeGet(t.Context(), "m1", p.Charge.ID); err != nil {
		t.Fatalf("ChargeGet after releasing a flagged record: %v; want the charge kept", err)
	}
	// A retry (or recovery) takes it over and settles it: the answer lands
	// in the outbox.
	claimed, ok, err := s.KeyClaim(t.Context(), "m1", "key-1", "tok_retry", longLease)
	if err != nil || !ok {
		t.Fatalf("KeyClaim of the released flagged record = %v, %v; want claimed", ok, err)
	}
	complete(t, s, "m1", "key-1", claimed.Token, []byte(`{"status":"captured"}`))
	es := claimAll(t, s, longLease)
	if len(es) != 1 || es[0].Key != "key-1" || es[0].ResponseStatus != 201 {
		t.Fatalf("outbox = %+v; want the retry's 201 for key-1", es)
	}

	// An unflagged record is still deleted, as before.
	q := newIntent("m1", "key-2")
	insert(t, s, q)
	if err := s.KeyRelease(t.Context(), "m1", "key-2", q.Token); err != nil {
		t.Fatalf("KeyRelease: %v", err)
	}
	_, err = s.KeyGet(t.Context(), "m1", "key-2")
	wantCode(t, "KeyGet after releasing an unflagged record", err, chargeonce.ENOTFOUND)
}
