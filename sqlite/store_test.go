package sqlite_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/sqlite"
	"github.com/chargeonce/chargeonce/storetest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newStore is the factory the conformance suite uses: a fresh, migrated
// store on its own file, closed when the test ends.
func newStore(t *testing.T) chargeonce.Store {
	return setup(t)
}

// setup opens a fresh, migrated store in t.TempDir().
func setup(t *testing.T) *sqlite.Store {
	t.Helper()
	return openAt(t, filepath.Join(t.TempDir(), "chargeonce.db"), true)
}

func setupB(b *testing.B) *sqlite.Store {
	b.Helper()
	return openAt(b, filepath.Join(b.TempDir(), "bench.db"), true)
}

func openAt(t testing.TB, path string, migrate bool) *sqlite.Store {
	t.Helper()
	ctx := context.Background()
	s, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	if migrate {
		if err := s.Migrate(ctx); err != nil {
			t.Fatalf("Migrate: %v", err)
		}
	}
	return s
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func params(merchant, key string, orderID int64) chargeonce.KeyInsertParams {
	return chargeonce.KeyInsertParams{
		Fingerprint: "fp-" + key,
		Token:       randHex(16),
		Lease:       time.Hour,
		Charge: chargeonce.Charge{
			ID:             "ch_" + randHex(12),
			MerchantID:     merchant,
			IdempotencyKey: key,
			OrderID:        orderID,
			AmountCents:    25000,
			Currency:       "BRL",
			PaymentToken:   "tok_ok",
			Description:    "test",
		},
	}
}

func mustInsert(t testing.TB, s chargeonce.Store, p chargeonce.KeyInsertParams) chargeonce.KeyRecord {
	t.Helper()
	rec, inserted, err := s.KeyInsert(context.Background(), p)
	if err != nil {
		t.Fatalf("KeyInsert: %v", err)
	}
	if !inserted {
		t.Fatalf("KeyInsert(%s/%s): inserted=false, want true", p.Charge.MerchantID, p.Charge.IdempotencyKey)
	}
	return rec
}

func wantCode(t *testing.T, err error, code string) {
	t.Helper()
	if got := chargeonce.ErrorCode(err); err == nil || got != code {
		t.Fatalf("error = %v (code %s), want code %s", err, got, code)
	}
}

// TestConformance runs the suite every chargeonce.Store passes.
func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, newStore)
}

// TestOperators runs the suite of chargeonce.OperatorStore.
func TestOperators(t *testing.T) {
	t.Parallel()
	storetest.RunOperators(t, newStore)
}

func TestOpenRefusesInMemory(t *testing.T) {
	t.Parallel()
	if _, err := sqlite.Open(context.Background(), ":memory:"); err == nil {
		t.Fatal("Open(:memory:) succeeded, want an error")
	}
	if _, err := sqlite.Open(context.Background(), ""); err == nil {
		t.Fatal("Open(\"\") succeeded, want an error")
	}
}

func TestMethodsBeforeMigrate(t *testing.T) {
	t.Parallel()
	s := openAt(t, filepath.Join(t.TempDir(), "x.db"), false)
	if err := s.Ping(context.Background()); err != nil {
		t.Fatalf("Ping before Migrate: %v", err)
	}
	if _, err := s.KeyGet(context.Background(), "m", "k"); err == nil {
		t.Fatal("KeyGet before Migrate succeeded, want an error")
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	_, err := s.KeyGet(context.Background(), "m", "k")
	wantCode(t, err, chargeonce.ENOTFOUND)
}

func TestKeyInsertAndGet(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	before := time.Now()
	p := params("m1", "k1", 7)
	rec := mustInsert(t, s, p)
	if rec.State != chargeonce.KeyProcessing || rec.Token != p.Token || rec.LeaseExpired {
		t.Fatalf("inserted record = %+v", rec)
	}
	if rec.Charge.Status != chargeonce.StatusProcessing || rec.Charge.ID != p.Charge.ID {
		t.Fatalf("inserted charge = %+v", rec.Charge)
	}
	if loc := rec.Charge.CreatedAt.Location(); loc != time.UTC {
		t.Fatalf("CreatedAt location = %v, want UTC", loc)
	}
	if d := rec.Charge.CreatedAt.Sub(before); d < -time.Second || d > 5*time.Second {
		t.Fatalf("CreatedAt %v is not near now %v", rec.Charge.CreatedAt, before)
	}
	if !rec.ExpiresAt.IsZero() {
		t.Fatalf("ExpiresAt = %v for a processing record, want none", rec.ExpiresAt)
	}
	if d := rec.LeaseUntil.Sub(rec.CreatedAt); d != time.Hour {
		t.Fatalf("LeaseUntil-CreatedAt = %v, want 1h", d)
	}

	got, err := s.KeyGet(ctx, "m1", "k1")
	if err != nil {
		t.Fatalf("KeyGet: %v", err)
	}
	if got.Token != rec.Token || got.Fingerprint != rec.Fingerprint || !got.CreatedAt.Equal(rec.CreatedAt) ||
		!reflect.DeepEqual(got.Charge, rec.Charge) {
		t.Fatalf("KeyGet = %+v\nwant     %+v", got, rec)
	}

	// A second attempt gets the first one's record.
	p2 := params("m1", "k1", 7)
	again, inserted, err := s.KeyInsert(ctx, p2)
	if err != nil || inserted {
		t.Fatalf("second KeyInsert: inserted=%v err=%v", inserted, err)
	}
	if again.Token != p.Token || again.Charge.ID != p.Charge.ID {
		t.Fatalf("second KeyInsert returned %+v, want the first record", again)
	}
	if _, err := s.ChargeGet(ctx, "m1", p2.Charge.ID); chargeonce.ErrorCode(err) != chargeonce.ENOTFOUND {
		t.Fatalf("losing attempt's charge exists: %v", err)
	}

	// The same key from another merchant is another intent.
	mustInsert(t, s, params("m2", "k1", 7))
}

func TestKeyInsertConcurrentSameKey(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	const n = 100
	var (
		wg       sync.WaitGroup
		winners  atomic.Int32
		mu       sync.Mutex
		tokens   = map[string]int{}
		start    = make(chan struct{})
		firstErr atomic.Value
	)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			rec, inserted, err := s.KeyInsert(ctx, params("m", "same-key", 42))
			if err != nil {
				firstErr.CompareAndSwap(nil, err)
				return
			}
			if inserted {
				winners.Add(1)
			}
			mu.Lock()
			tokens[rec.Token]++
			mu.Unlock()
		}()
	}
	close(start)
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		t.Fatalf("KeyInsert: %v", err)
	}
	if w := winners.Load(); w != 1 {
		t.Fatalf("%d attempts inserted, want exactly 1", w)
	}
	if len(tokens) != 1 {
		t.Fatalf("attempts saw %d different owners, want 1: %v", len(tokens), tokens)
	}
	charges, err := s.ChargesListByOrder(ctx, "m", 42)
	if err != nil {
		t.Fatalf("ChargesListByOrder: %v", err)
	}
	if len(charges) != 1 {
		t.Fatalf("%d charges for the order, want 1", len(charges))
	}
}

func TestKeyCompleteStaleToken(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	rec := mustInsert(t, s, params("m", "k", 1))

	cp := chargeonce.KeyCompleteParams{
		MerchantID: "m", Key: "k", Token: "not-the-owner", TTL: time.Hour,
		ChargeStatus: chargeonce.StatusCaptured, ResponseStatus: 201,
		ResponseBody: []byte(`{"stale":true}`),
	}
	wantCode(t, s.KeyComplete(ctx, cp), chargeonce.ESTALE)
	if got, _ := s.KeyGet(ctx, "m", "k"); got.State != chargeonce.KeyProcessing || got.ResponseBody != nil {
		t.Fatalf("stale completion changed the record: %+v", got)
	}

	cp.Token = rec.Token
	cp.ChargeStatus = chargeonce.StatusDeclined
	cp.DeclineCode = "insufficient_funds"
	cp.ResponseStatus = 402
	cp.ResponseBody = []byte(`{"type":"card-declined"}`)
	if err := s.KeyComplete(ctx, cp); err != nil {
		t.Fatalf("KeyComplete by the owner: %v", err)
	}
	// Completed: even the owner cannot complete it twice.
	wantCode(t, s.KeyComplete(ctx, cp), chargeonce.ESTALE)

	got, err := s.KeyGet(ctx, "m", "k")
	if err != nil {
		t.Fatalf("KeyGet: %v", err)
	}
	if got.State != chargeonce.KeyCompleted || got.ResponseStatus != 402 || string(got.ResponseBody) != `{"type":"card-declined"}` {
		t.Fatalf("completed record = %+v", got)
	}
	if got.Charge.Status != chargeonce.StatusDeclined || got.Charge.DeclineCode != "insufficient_funds" {
		t.Fatalf("completed charge = %+v", got.Charge)
	}
	ch, err := s.ChargeGet(ctx, "m", rec.Charge.ID)
	if err != nil || !reflect.DeepEqual(ch, got.Charge) {
		t.Fatalf("ChargeGet = %+v, %v; want %+v", ch, err, got.Charge)
	}
	// A replayed attempt sees the stored response.
	again, inserted, err := s.KeyInsert(ctx, params("m", "k", 1))
	if err != nil || inserted || again.ResponseStatus != 402 {
		t.Fatalf("KeyInsert after completion: %+v inserted=%v err=%v", again, inserted, err)
	}
}

func TestKeyRelease(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	rec := mustInsert(t, s, params("m", "k", 1))
	wantCode(t, s.KeyRelease(ctx, "m", "k", "intruder"), chargeonce.ESTALE)
	if err := s.KeyRelease(ctx, "m", "k", rec.Token); err != nil {
		t.Fatalf("KeyRelease: %v", err)
	}
	_, err := s.KeyGet(ctx, "m", "k")
	wantCode(t, err, chargeonce.ENOTFOUND)
	_, err = s.ChargeGet(ctx, "m", rec.Charge.ID)
	wantCode(t, err, chargeonce.ENOTFOUND)
	wantCode(t, s.KeyRelease(ctx, "m", "k", rec.Token), chargeonce.ESTALE)
	mustInsert(t, s, params("m", "k", 1))
}

func TestLeaseAndClaim(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	rec := mustInsert(t, s, params("m", "k", 1))

	if cur, claimed, err := s.KeyClaim(ctx, "m", "k", "rescuer", time.Minute); err != nil || claimed || cur.Token != rec.Token {
		t.Fatalf("KeyClaim during lease: claimed=%v err=%v token=%s", claimed, err, cur.Token)
	}
	wantCode(t, s.KeyLeaseSet(ctx, "m", "k", "intruder", 0, false), chargeonce.ESTALE)
	if err := s.KeyLeaseSet(ctx, "m", "k", rec.Token, 0, true); err != nil {
		t.Fatalf("KeyLeaseSet: %v", err)
	}
	got, err := s.KeyGet(ctx, "m", "k")
	if err != nil {
		t.Fatalf("KeyGet: %v", err)
	}
	if !got.LeaseExpired || got.RecoveryAttempts != 1 {
		t.Fatalf("after KeyLeaseSet(0): %+v", got)
	}
	if st, err := s.KeysStuck(ctx); err != nil || st.Count != 1 || st.OldestAge < 0 {
		t.Fatalf("KeysStuck = %+v, %v", st, err)
	}

	claimedRec, claimed, err := s.KeyClaim(ctx, "m", "k", "rescuer", time.Minute)
	if err != nil || !claimed {
		t.Fatalf("KeyClaim after lease: claimed=%v err=%v", claimed, err)
	}
	if claimedRec.Token != "rescuer" || claimedRec.LeaseExpired || claimedRec.Charge.ID != rec.Charge.ID {
		t.Fatalf("claimed record = %+v", claimedRec)
	}
	if _, claimed, _ := s.KeyClaim(ctx, "m", "k", "second-rescuer", time.Minute); claimed {
		t.Fatal("a second rescuer claimed a record under a running lease")
	}
	// The original attempt lost ownership.
	wantCode(t, s.KeyComplete(ctx, chargeonce.KeyCompleteParams{
		MerchantID: "m", Key: "k", Token: rec.Token,
		ChargeStatus: chargeonce.StatusCaptured, ResponseStatus: 201, ResponseBody: []byte("{}"),
	}), chargeonce.ESTALE)
	// Claimed again, but recovery already failed on it once: still counted
	// as stuck until it settles.
	if st, err := s.KeysStuck(ctx); err != nil || st.Count != 1 {
		t.Fatalf("KeysStuck after claim = %+v, %v", st, err)
	}
	_, _, err = s.KeyClaim(ctx, "m", "missing", "x", time.Minute)
	wantCode(t, err, chargeonce.ENOTFOUND)
}

// Several stores on one file, several goroutines each: every orphan is
// claimed exactly once.
func TestKeysClaimExpiredConcurrent(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "claim.db")
	stores := []*sqlite.Store{openAt(t, path, true), openAt(t, path, false), openAt(t, path, false)}
	ctx := context.Background()
	const records = 60
	for i := 0; i < records; i++ {
		p := params("m", fmt.Sprintf("k%d", i), int64(i+1))
		p.Lease = 0
		mustInsert(t, stores[0], p)
	}
	// Not orphaned: must never be claimed.
	mustInsert(t, stores[0], params("m", "live", 999))

	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		seen = map[string]int{}
		errs = make(chan error, 30)
	)
	for i := 0; i < 30; i++ {
		wg.Add(1)
		go func(s *sqlite.Store) {
			defer wg.Done()
			for {
				recs, err := s.KeysClaimExpired(ctx, time.Hour, 3)
				if err != nil {
					errs <- err
					return
				}
				if len(recs) == 0 {
					return
				}
				mu.Lock()
				for _, r := range recs {
					seen[r.Key]++
					if r.LeaseExpired || r.Token == "" || r.State != chargeonce.KeyProcessing {
						errs <- fmt.Errorf("claimed record %+v", r)
					}
				}
				mu.Unlock()
			}
		}(stores[i%len(stores)])
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(seen) != records {
		t.Fatalf("claimed %d records, want %d", len(seen), records)
	}
	for k, n := range seen {
		if n != 1 {
			t.Fatalf("record %s claimed %d times", k, n)
		}
	}
	if seen["live"] != 0 {
		t.Fatal("claimed a record whose lease is running")
	}
}

func TestExpiry(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	var old []chargeonce.KeyRecord
	for i := 0; i < 5; i++ {
		p := params("m", fmt.Sprintf("old%d", i), 1)
		rec := mustInsert(t, s, p)
		if err := s.KeyComplete(ctx, chargeonce.KeyCompleteParams{
			MerchantID: "m", Key: rec.Key, Token: rec.Token, TTL: time.Millisecond,
			ChargeStatus: chargeonce.StatusCaptured, ResponseStatus: 201, ResponseBody: []byte("{}"),
		}); err != nil {
			t.Fatalf("KeyComplete: %v", err)
		}
		old = append(old, rec)
	}
	mustInsert(t, s, params("m", "young", 1))
	// Unsettled: no expiry, kept by the sweeper and by KeyInsert.
	unsettled := params("m", "unsettled", 1)
	mustInsert(t, s, unsettled)
	time.Sleep(10 * time.Millisecond)
	if rec, inserted, err := s.KeyInsert(ctx, params("m", "unsettled", 1)); err != nil || inserted || rec.Token != unsettled.Token {
		t.Fatalf("KeyInsert over an expired processing record: inserted=%v err=%v", inserted, err)
	}

	// A key reused after expiry is a new intent; the old charge is kept.
	p := params("m", "old0", 1)
	rec, inserted, err := s.KeyInsert(ctx, p)
	if err != nil || !inserted || rec.Token != p.Token {
		t.Fatalf("KeyInsert on an expired key: inserted=%v err=%v rec=%+v", inserted, err, rec)
	}
	if _, err := s.ChargeGet(ctx, "m", old[0].Charge.ID); err != nil {
		t.Fatalf("expired record's charge: %v", err)
	}

	var total []int
	for {
		n, err := s.KeysDeleteExpired(ctx, 2)
		if err != nil {
			t.Fatalf("KeysDeleteExpired: %v", err)
		}
		total = append(total, n)
		if n == 0 {
			break
		}
	}
	if fmt.Sprint(total) != "[2 2 0]" {
		t.Fatalf("batches deleted %v, want [2 2 0]", total)
	}
	for _, r := range old[1:] {
		if _, err := s.KeyGet(ctx, "m", r.Key); chargeonce.ErrorCode(err) != chargeonce.ENOTFOUND {
			t.Fatalf("expired key %s still there: %v", r.Key, err)
		}
		if _, err := s.ChargeGet(ctx, "m", r.Charge.ID); err != nil {
			t.Fatalf("charge of swept key %s: %v", r.Key, err)
		}
	}
	for _, k := range []string{"old0", "young", "unsettled"} {
		if _, err := s.KeyGet(ctx, "m", k); err != nil {
			t.Fatalf("live key %s: %v", k, err)
		}
	}
	charges, err := s.ChargesListByOrder(ctx, "m", 1)
	if err != nil || len(charges) != 8 {
		t.Fatalf("ChargesListByOrder = %d charges, %v; want 8", len(charges), err)
	}
}

func TestChargesListByOrderNewestFirst(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	var ids []string
	for i := 0; i < 20; i++ {
		// Back to back: many share a millisecond, and the rowid decides.
		rec := mustInsert(t, s, params("m", fmt.Sprintf("k%d", i), 5))
		ids = append(ids, rec.Charge.ID)
	}
	mustInsert(t, s, params("other", "k0", 5))
	mustInsert(t, s, params("m", "other-order", 6))

	got, err := s.ChargesListByOrder(ctx, "m", 5)
	if err != nil {
		t.Fatalf("ChargesListByOrder: %v", err)
	}
	if len(got) != len(ids) {
		t.Fatalf("got %d charges, want %d", len(got), len(ids))
	}
	for i, c := range got {
		if want := ids[len(ids)-1-i]; c.ID != want {
			t.Fatalf("charge %d is %s, want %s (newest first)", i, c.ID, want)
		}
		if c.MerchantID != "m" || c.OrderID != 5 {
			t.Fatalf("foreign charge listed: %+v", c)
		}
		if i > 0 && c.CreatedAt.After(got[i-1].CreatedAt) {
			t.Fatalf("charge %d is newer than charge %d", i, i-1)
		}
	}
	none, err := s.ChargesListByOrder(ctx, "m", 12345)
	if err != nil || none == nil || len(none) != 0 {
		t.Fatalf("ChargesListByOrder(no charges) = %#v, %v; want empty", none, err)
	}
}

func TestChargeGetOtherMerchant(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	rec := mustInsert(t, s, params("alice", "k", 1))
	if _, err := s.ChargeGet(ctx, "alice", rec.Charge.ID); err != nil {
		t.Fatalf("ChargeGet own: %v", err)
	}
	_, err := s.ChargeGet(ctx, "mallory", rec.Charge.ID)
	wantCode(t, err, chargeonce.ENOTFOUND)
	_, err = s.ChargeGet(ctx, "alice", "ch_missing")
	wantCode(t, err, chargeonce.ENOTFOUND)
	_, err = s.KeyGet(ctx, "mallory", "k")
	wantCode(t, err, chargeonce.ENOTFOUND)
}

// Several instances start at once on one file: each runs Migrate, the
// schema is applied once, and every instance can use it.
func TestMigrateConcurrent(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "migrate.db")
	const n = 8
	stores := make([]*sqlite.Store, n)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Open too races: the first connection switches the new
			// file to WAL while the others wait for it.
			s, err := sqlite.Open(ctx, path)
			if err != nil {
				errs[i] = err
				return
			}
			stores[i] = s
			errs[i] = s.Migrate(ctx)
		}()
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, s := range stores {
			if s != nil {
				s.Close()
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("concurrent Migrate: %v", err)
	}
	for i, s := range stores {
		mustInsert(t, s, params("m", fmt.Sprintf("k%d", i), 1))
		if err := s.Migrate(ctx); err != nil {
			t.Fatalf("Migrate again: %v", err)
		}
	}

	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var rows int
	if err := db.QueryRow(`SELECT count(*) FROM schema_migrations`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob("migrations/*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("listing migrations: %v", err)
	}
	if rows != len(files) {
		t.Fatalf("schema_migrations has %d rows, want %d (one per migration)", rows, len(files))
	}
}

func TestPingAndClose(t *testing.T) {
	t.Parallel()
	s, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "p.db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(context.Background()); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := s.Ping(context.Background()); err == nil {
		t.Fatal("Ping after Close succeeded")
	}
}

// A file that cannot be opened is an error that says so and names the file;
// advice for a charge in flight (retry with the same Idempotency-Key) has no
// place in it.
func TestOpenUnopenableFileSaysSo(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "no-such-dir", "x.db")
	_, err := sqlite.Open(context.Background(), path)
	if err == nil {
		t.Fatal("Open in a directory that does not exist succeeded")
	}
	if msg := err.Error(); !strings.Contains(msg, path) || !strings.Contains(msg, "unable to open database file") || strings.Contains(msg, "Idempotency-Key") {
		t.Fatalf("Open: %q; want the file named, SQLite's reason, and no Idempotency-Key advice", msg)
	}
}
