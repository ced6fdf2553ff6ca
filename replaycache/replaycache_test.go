package replaycache_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/internal/pgtest"
	"github.com/chargeonce/chargeonce/replaycache"
	"github.com/chargeonce/chargeonce/storetest"
)

func TestMain(m *testing.M) {
	pgtest.VerifyMain(m)
}

// The conformance suite must hold through the cache, on both stores: with
// the default margin (short-lived test records are then never cached) and
// with a margin of a nanosecond, so that entries are served right up to
// their expiry and the suite's expiry tests exercise the eviction.
func TestConformance(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"sqlite", "postgres"} {
		for name, margin := range map[string]time.Duration{"default-margin": 0, "no-margin": time.Nanosecond} {
			t.Run(kind+"/"+name, func(t *testing.T) {
				t.Parallel()
				storetest.Run(t, func(t *testing.T) chargeonce.Store {
					return replaycache.New(apitest.Store(t, kind), replaycache.Options{SkewMargin: margin})
				})
			})
		}
	}
}

// counting counts the calls that reach the wrapped store.
type counting struct {
	chargeonce.Store
	inserts, gets, refundInserts atomic.Int64
}

func (c *counting) KeyInsert(ctx context.Context, p chargeonce.KeyInsertParams) (chargeonce.KeyRecord, bool, error) {
	c.inserts.Add(1)
	return c.Store.KeyInsert(ctx, p)
}

func (c *counting) KeyGet(ctx context.Context, merchantID, key string) (chargeonce.KeyRecord, error) {
	c.gets.Add(1)
	return c.Store.KeyGet(ctx, merchantID, key)
}

// clock is a settable clock for Options.Now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func intent(merchant, key string) chargeonce.KeyInsertParams {
	return chargeonce.KeyInsertParams{
		Fingerprint: "fp-" + key,
		Token:       randHex(16),
		Lease:       time.Hour,
		Charge: chargeonce.Charge{
			ID: "ch_" + randHex(12), MerchantID: merchant, IdempotencyKey: key,
			OrderID: 1, AmountCents: 100, Currency: "BRL", PaymentToken: "tok_ok",
		},
	}
}

type fixture struct {
	inner *counting
	cache *replaycache.Store
	clock *clock
}

func setup(t *testing.T, opts replaycache.Options) fixture {
	t.Helper()
	inner := &counting{Store: apitest.SQLiteStore(t)}
	clk := &clock{t: time.Now()}
	opts.Now = clk.now
	return fixture{inner: inner, cache: replaycache.New(inner, opts), clock: clk}
}

// completed inserts and completes an intent directly in the inner store.
func (f fixture) completed(t *testing.T, merchant, key string, ttl time.Duration, body string) chargeonce.KeyInsertParams {
	t.Helper()
	ctx := context.Background()
	p := intent(merchant, key)
	direct := f.inner.Store // past the counting wrapper
	if _, inserted, err := direct.KeyInsert(ctx, p); err != nil || !inserted {
		t.Fatalf("KeyInsert: inserted=%v err=%v", inserted, err)
	}
	if err := direct.KeyComplete(ctx, chargeonce.KeyCompleteParams{
		MerchantID: merchant, Key: key, Token: p.Token, ChargeStatus: chargeonce.StatusCaptured,
		ResponseStatus: 201, ResponseBody: []byte(body), TTL: ttl,
	}); err != nil {
		t.Fatalf("KeyComplete: %v", err)
	}
	return p
}

func TestCompletedRecordIsServedFromMemoryAfterTheFirstRead(t *testing.T) {
	t.Parallel()
	f := setup(t, replaycache.Options{})
	ctx := context.Background()
	p := f.completed(t, "m", "k", time.Hour, `{"id":"first"}`)

	for i := range 5 {
		rec, inserted, err := f.cache.KeyInsert(ctx, intent("m", "k"))
		if err != nil || inserted {
			t.Fatalf("retry %d: inserted=%v err=%v", i, inserted, err)
		}
		if rec.State != chargeonce.KeyCompleted || string(rec.ResponseBody) != `{"id":"first"}` || rec.Fingerprint != p.Fingerprint || rec.Charge.ID != p.Charge.ID {
			t.Fatalf("retry %d got %+v", i, rec)
		}
	}
	if got, err := f.cache.KeyGet(ctx, "m", "k"); err != nil || string(got.ResponseBody) != `{"id":"first"}` {
		t.Fatalf("KeyGet = %+v, %v", got, err)
	}
	if n := f.inner.inserts.Load() + f.inner.gets.Load(); n != 1 {
		t.Fatalf("the store was asked %d times, want once", n)
	}
	if st := f.cache.Stats(); st.Hits != 5 || st.Misses != 1 || st.Entries != 1 {
		t.Fatalf("Stats = %+v", st)
	}
}

func TestProcessingRecordIsNeverCached(t *testing.T) {
	t.Parallel()
	f := setup(t, replaycache.Options{})
	ctx := context.Background()
	p := intent("m", "k")
	if _, inserted, err := f.cache.KeyInsert(ctx, p); err != nil || !inserted {
		t.Fatalf("first KeyInsert: inserted=%v err=%v", inserted, err)
	}
	for range 3 {
		rec, inserted, err := f.cache.KeyInsert(ctx, intent("m", "k"))
		if err != nil || inserted || rec.State != chargeonce.KeyProcessing {
			t.Fatalf("retry: state=%s inserted=%v err=%v", rec.State, inserted, err)
		}
		if _, err := f.cache.KeyGet(ctx, "m", "k"); err != nil {
			t.Fatal(err)
		}
	}
	if n := f.inner.inserts.Load(); n != 4 {
		t.Fatalf("KeyInsert reached the store %d times, want 4", n)
	}
	if n := f.inner.gets.Load(); n != 3 {
		t.Fatalf("KeyGet reached the store %d times, want 3", n)
	}
	// Once completed, the record is cached from its next read on.
	if err := f.cache.KeyComplete(ctx, chargeonce.KeyCompleteParams{
		MerchantID: "m", Key: "k", Token: p.Token, ChargeStatus: chargeonce.StatusCaptured, ResponseStatus: 201, ResponseBody: []byte("done"), TTL: time.Hour,
	}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if rec, _ := f.cache.KeyGet(ctx, "m", "k"); string(rec.ResponseBody) != "done" {
			t.Fatalf("body %q", rec.ResponseBody)
		}
	}
	if n := f.inner.gets.Load(); n != 4 {
		t.Fatalf("KeyGet reached the store %d times, want 4", n)
	}
}

func TestEntriesAreScopedToTheMerchant(t *testing.T) {
	t.Parallel()
	f := setup(t, replaycache.Options{})
	ctx := context.Background()
	f.completed(t, "a", "k", time.Hour, "a's answer")
	if rec, _, err := f.cache.KeyInsert(ctx, intent("a", "k")); err != nil || string(rec.ResponseBody) != "a's answer" {
		t.Fatalf("a: %q %v", rec.ResponseBody, err)
	}
	// Merchant b's first use of the same key is a new intent, in the store.
	rec, inserted, err := f.cache.KeyInsert(ctx, intent("b", "k"))
	if err != nil || !inserted || rec.MerchantID != "b" {
		t.Fatalf("b: inserted=%v merchant=%q err=%v", inserted, rec.MerchantID, err)
	}
	if _, err := f.cache.KeyGet(ctx, "c", "k"); chargeonce.ErrorCode(err) != chargeonce.ENOTFOUND {
		t.Fatalf("c: err %v, want ENOTFOUND", err)
	}
}

// An entry is served for the time the record had left when it was read (by
// the database's clock), less the margin, counted on the instance's clock.
func TestEntryIsNotServedPastExpiryMinusMargin(t *testing.T) {
	t.Parallel()
	const margin = time.Minute
	f := setup(t, replaycache.Options{SkewMargin: margin})
	ctx := context.Background()
	f.completed(t, "m", "k", time.Hour, "x")
	read := f.clock.now()
	rec, err := f.cache.KeyGet(ctx, "m", "k") // cached
	if err != nil {
		t.Fatal(err)
	}
	if rec.ExpiresIn <= time.Hour-time.Minute || rec.ExpiresIn > time.Hour {
		t.Fatalf("ExpiresIn %v, want about an hour", rec.ExpiresIn)
	}
	f.clock.set(read.Add(rec.ExpiresIn - margin - time.Second))
	got, err := f.cache.KeyGet(ctx, "m", "k")
	if err != nil || f.inner.gets.Load() != 1 {
		t.Fatalf("a second before the margin: err=%v, store reads %d, want 1", err, f.inner.gets.Load())
	}
	if got.ExpiresIn < margin || got.ExpiresIn > margin+2*time.Second {
		t.Fatalf("served with ExpiresIn %v, want the time left counted down (about %v)", got.ExpiresIn, margin+time.Second)
	}
	f.clock.set(read.Add(rec.ExpiresIn - margin))
	if _, err := f.cache.KeyGet(ctx, "m", "k"); err != nil || f.inner.gets.Load() != 2 {
		t.Fatalf("at the margin: err=%v, store reads %d, want 2", err, f.inner.gets.Load())
	}
	// Only this instance's clock moved: the database still gives the
	// record an hour, so it is cached again for that hour.
	if _, err := f.cache.KeyGet(ctx, "m", "k"); err != nil || f.inner.gets.Load() != 2 {
		t.Fatalf("after the clock jumped: err=%v, store reads %d, want 2", err, f.inner.gets.Load())
	}
}

func TestRecordsCloseToExpiryAreNotCached(t *testing.T) {
	t.Parallel()
	f := setup(t, replaycache.Options{}) // default margin: a minute
	ctx := context.Background()
	f.completed(t, "m", "k", 30*time.Second, "x")
	for range 3 {
		if _, err := f.cache.KeyGet(ctx, "m", "k"); err != nil {
			t.Fatal(err)
		}
	}
	if n := f.inner.gets.Load(); n != 3 {
		t.Fatalf("store reads %d, want 3", n)
	}
}

func TestSizeIsBounded(t *testing.T) {
	t.Parallel()
	f := setup(t, replaycache.Options{MaxEntries: 16}) // one entry per shard
	ctx := context.Background()
	for range 100 {
		k := "k" + randHex(4)
		f.completed(t, "m", k, time.Hour, "x")
		if _, err := f.cache.KeyGet(ctx, "m", k); err != nil {
			t.Fatal(err)
		}
	}
	if n := f.cache.Stats().Entries; n > 16 {
		t.Fatalf("%d entries, want at most 16", n)
	}
}

func TestCallersCannotChangeCachedBytes(t *testing.T) {
	t.Parallel()
	f := setup(t, replaycache.Options{})
	ctx := context.Background()
	f.completed(t, "m", "k", time.Hour, "original")
	rec, _ := f.cache.KeyGet(ctx, "m", "k")
	rec.ResponseBody[0] = 'X'
	rec, _ = f.cache.KeyGet(ctx, "m", "k")
	rec.ResponseBody[0] = 'Y'
	if rec, _ = f.cache.KeyGet(ctx, "m", "k"); string(rec.ResponseBody) != "original" {
		t.Fatalf("cached body changed to %q", rec.ResponseBody)
	}
}

// Through the engine, a cached record still tells a replay (the stored
// bytes) from a reused key (422): the fingerprint is part of the entry.
func TestEngineOverCache(t *testing.T) {
	t.Parallel()
	f := setup(t, replaycache.Options{})
	sim := apitest.Simulator(t, acquirer.Options{})
	eng := engine.New(f.cache, sim, engine.Options{})
	ctx := context.Background()
	req := func(amount int64) *chargeonce.ChargeRequest {
		r := &chargeonce.ChargeRequest{OrderID: 9, AmountCents: amount, PaymentToken: "tok_ok"}
		if err := r.Normalize(); err != nil {
			t.Fatal(err)
		}
		return r
	}
	first, err := eng.Charge(ctx, "m", "key-1", req(100))
	if err != nil || first.Status != 201 || first.Replayed {
		t.Fatalf("first: %+v %v", first, err)
	}
	for range 3 {
		again, err := eng.Charge(ctx, "m", "key-1", req(100))
		if err != nil || !again.Replayed || again.Status != 201 || string(again.Body) != string(first.Body) {
			t.Fatalf("replay: %+v %v", again, err)
		}
	}
	if _, err := eng.Charge(ctx, "m", "key-1", req(999)); chargeonce.ErrorCode(err) != chargeonce.EKEYREUSED {
		t.Fatalf("reused key: err %v, want %s", err, chargeonce.EKEYREUSED)
	}
	if st := f.cache.Stats(); st.Hits < 3 {
		t.Fatalf("Stats = %+v, want the replays served from memory", st)
	}
	if s := sim.Stats(); s.CaptureRequests != 1 {
		t.Fatalf("the acquirer saw %d capture requests, want 1", s.CaptureRequests)
	}
}

func (c *counting) RefundInsert(ctx context.Context, p chargeonce.RefundInsertParams) (chargeonce.KeyRecord, bool, error) {
	c.refundInserts.Add(1)
	return c.Store.RefundInsert(ctx, p)
}

// A refund's replays are answered from memory like a charge's, and a key
// cached for a charge answers a refund with the same key 422, as the store
// would (one namespace of keys per merchant).
func TestEngineOverCacheRefunds(t *testing.T) {
	t.Parallel()
	f := setup(t, replaycache.Options{})
	sim := apitest.Simulator(t, acquirer.Options{})
	eng := engine.New(f.cache, sim, engine.Options{})
	ctx := context.Background()
	charge := &chargeonce.ChargeRequest{OrderID: 9, AmountCents: 1000, PaymentToken: "tok_ok"}
	if err := charge.Normalize(); err != nil {
		t.Fatal(err)
	}
	captured, err := eng.Charge(ctx, "m", "charge-1", charge)
	if err != nil || captured.Status != 201 {
		t.Fatalf("charge: %+v %v", captured, err)
	}
	var ch struct{ ID string }
	if err := json.Unmarshal(captured.Body, &ch); err != nil || ch.ID == "" {
		t.Fatalf("charge body %s: %v", captured.Body, err)
	}
	refund := func(amount int64) *chargeonce.RefundRequest {
		r := &chargeonce.RefundRequest{AmountCents: amount}
		if err := r.Normalize(); err != nil {
			t.Fatal(err)
		}
		return r
	}
	first, err := eng.Refund(ctx, "m", ch.ID, "refund-1", refund(300))
	if err != nil || first.Status != 201 || first.Replayed {
		t.Fatalf("first refund: %+v %v", first, err)
	}
	before := f.inner.refundInserts.Load()
	for range 5 {
		again, err := eng.Refund(ctx, "m", ch.ID, "refund-1", refund(300))
		if err != nil || !again.Replayed || again.Status != 201 || string(again.Body) != string(first.Body) {
			t.Fatalf("refund replay: %+v %v", again, err)
		}
	}
	if n := f.inner.refundInserts.Load() - before; n > 1 {
		t.Fatalf("5 refund replays reached the store %d times, want at most once (then from memory)", n)
	}
	if _, err := eng.Refund(ctx, "m", ch.ID, "refund-1", refund(400)); chargeonce.ErrorCode(err) != chargeonce.EKEYREUSED {
		t.Fatalf("refund key reused for another amount: err %v, want %s", err, chargeonce.EKEYREUSED)
	}
	if _, err := eng.Refund(ctx, "m", ch.ID, "charge-1", refund(100)); chargeonce.ErrorCode(err) != chargeonce.EKEYREUSED {
		t.Fatalf("a charge's key sent to refund: err %v, want %s", err, chargeonce.EKEYREUSED)
	}
	if s := sim.Stats(); s.RefundRequests != 1 {
		t.Fatalf("the acquirer saw %d refund requests, want 1", s.RefundRequests)
	}
}
