// Package storetest is the conformance suite for chargeonce.Store: the one
// definition of how a store behaves, run against every implementation
// (postgres.Store, sqlite.Store), so that the engine above can rely on the
// contract rather than on a particular database.
//
// A store's tests call Run with a factory:
//
//	func TestStore(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) chargeonce.Store {
//			s := openIsolatedStore(t) // fresh, migrated, closed in t.Cleanup
//			return s
//		})
//	}
//
// The suite leans on concurrency (100 goroutines racing for one key, eight
// recovery loops sharing a backlog); run it with -race.
package storetest

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
)

// Lease and TTL values used by the suite. longLease is long enough that no
// lease the suite does not expire on purpose ends during a run.
const (
	longLease = time.Hour
	longTTL   = 24 * time.Hour
)

// Run runs the conformance suite. newStore must return a fresh, migrated
// store that no other test can see (its own database or schema) and arrange
// to close it in t.Cleanup. Every subtest runs in parallel with the others
// on a store of its own.
func Run(t *testing.T, newStore func(t *testing.T) chargeonce.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s chargeonce.Store)
	}{
		{"InsertThenGet", testInsertThenGet},
		{"InsertExistingReturnsFirst", testInsertExistingReturnsFirst},
		{"KeysScopedToMerchant", testKeysScopedToMerchant},
		{"InsertRaceOneWinner", testInsertRaceOneWinner},
		{"RaceManyKeys", testRaceManyKeys},
		{"RaceInsertsWithCompletions", testRaceInsertsWithCompletions},
		{"CompleteByOwner", testCompleteByOwner},
		{"CompleteDeclined", testCompleteDeclined},
		{"CompleteStaleToken", testCompleteStaleToken},
		{"ClaimFencesOldToken", testClaimFencesOldToken},
		{"Release", testRelease},
		{"ReleaseStale", testReleaseStale},
		{"LeaseSetAndClaim", testLeaseSetAndClaim},
		{"ClaimNotClaimable", testClaimNotClaimable},
		{"ClaimExpiredConcurrentOnce", testClaimExpiredConcurrentOnce},
		{"ClaimExpiredLimitAndSkips", testClaimExpiredLimitAndSkips},
		{"DeleteExpiredKeepsCharge", testDeleteExpiredKeepsCharge},
		{"DeleteExpiredBatches", testDeleteExpiredBatches},
		{"ExpiredKeyIsNewIntent", testExpiredKeyIsNewIntent},
		{"ExpiredProcessingKept", testExpiredProcessingKept},
		{"ExpiryStartsAtCompletion", testExpiryStartsAtCompletion},
		{"ExpiresInByDatabaseClock", testExpiresInByDatabaseClock},
		{"Stuck", testStuck},
		{"ChargeGetScopedToMerchant", testChargeGetScopedToMerchant},
		{"ChargesListByOrder", testChargesListByOrder},
		{"ResponseBodyBytes", testResponseBodyBytes},
		{"MetadataRoundTrips", testMetadataRoundTrips},
		{"MigrateAgainAndPing", testMigrateAgainAndPing},
		{"Hostile", testHostile},
	}
	tests = append(tests, outboxTests...)
	tests = append(tests, pageTests...)
	tests = append(tests, webhookTests...)
	tests = append(tests, refundTests...)
	tests = append(tests, operationTests...)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.fn(t, newStore(t))
		})
	}
}

// randHex returns n random bytes, hex-encoded.
func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// newIntent describes a new intent for key under merchant, with a fresh
// token and charge id and a long lease and TTL.
func newIntent(merchant, key string) chargeonce.KeyInsertParams {
	return chargeonce.KeyInsertParams{
		Fingerprint: "fp_" + randHex(8),
		Token:       "tok_" + randHex(8),
		Lease:       longLease,
		Charge: chargeonce.Charge{
			ID:             "ch_" + randHex(8),
			MerchantID:     merchant,
			IdempotencyKey: key,
			OrderID:        123,
			AmountCents:    25000,
			Currency:       "BRL",
			PaymentToken:   "tok_ok",
			Description:    "two coffees",
		},
	}
}

// insert inserts p and fails the test unless it created a new record.
func insert(t *testing.T, s chargeonce.Store, p chargeonce.KeyInsertParams) chargeonce.KeyRecord {
	t.Helper()
	rec, inserted, err := s.KeyInsert(t.Context(), p)
	if err != nil {
		t.Fatalf("KeyInsert(%s/%s): %v", p.Charge.MerchantID, p.Charge.IdempotencyKey, err)
	}
	if !inserted {
		t.Fatalf("KeyInsert(%s/%s): inserted=false for a new key (existing token %s)", p.Charge.MerchantID, p.Charge.IdempotencyKey, rec.Token)
	}
	return rec
}

// get reads a record and fails the test if it cannot.
func get(t *testing.T, s chargeonce.Store, merchant, key string) chargeonce.KeyRecord {
	t.Helper()
	rec, err := s.KeyGet(t.Context(), merchant, key)
	if err != nil {
		t.Fatalf("KeyGet(%s/%s): %v", merchant, key, err)
	}
	return rec
}

// complete stores a captured answer for the record owned by token, kept
// for longTTL.
func complete(t *testing.T, s chargeonce.Store, merchant, key, token string, body []byte) {
	t.Helper()
	completeTTL(t, s, merchant, key, token, body, longTTL)
}

// completeTTL stores a captured answer kept for ttl from now.
func completeTTL(t *testing.T, s chargeonce.Store, merchant, key, token string, body []byte, ttl time.Duration) {
	t.Helper()
	err := s.KeyComplete(t.Context(), chargeonce.KeyCompleteParams{
		MerchantID: merchant, Key: key, Token: token,
		ChargeStatus: chargeonce.StatusCaptured, ResponseStatus: 201, ResponseBody: body, TTL: ttl,
	})
	if err != nil {
		t.Fatalf("KeyComplete(%s/%s): %v", merchant, key, err)
	}
}

// wantCode fails the test unless err carries code.
func wantCode(t *testing.T, what string, err error, code string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: got no error, want %s", what, code)
	}
	if got := chargeonce.ErrorCode(err); got != code {
		t.Fatalf("%s: got error %v (code %s), want code %s", what, err, got, code)
	}
}

// checkCharge compares a charge with the one that was inserted (p) and the
// status it should have.
func checkCharge(t *testing.T, what string, got chargeonce.Charge, p chargeonce.Charge, status chargeonce.Status, declineCode string) {
	t.Helper()
	want := p
	want.Status, want.DeclineCode, want.CreatedAt = status, declineCode, got.CreatedAt
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s: charge\n got %+v\nwant %+v", what, got, want)
	}
	if got.CreatedAt.IsZero() {
		t.Fatalf("%s: charge has no CreatedAt", what)
	}
}

// near reports whether d is within tolerance of want; the tolerance absorbs
// the time a statement takes and database timestamp rounding.
func near(d, want time.Duration) bool {
	const tolerance = 5 * time.Second
	return d >= want-tolerance && d <= want+tolerance
}

func testInsertThenGet(t *testing.T, s chargeonce.Store) {
	p := newIntent("m1", "key-1")
	p.Charge.Status = chargeonce.StatusCaptured // ignored: new charges are processing
	p.Charge.DeclineCode = ""
	rec := insert(t, s, p)

	check := func(what string, rec chargeonce.KeyRecord) {
		t.Helper()
		if rec.MerchantID != "m1" || rec.Key != "key-1" || rec.Fingerprint != p.Fingerprint || rec.Token != p.Token {
			t.Fatalf("%s: identity = %s/%s fp=%s token=%s, want m1/key-1 fp=%s token=%s",
				what, rec.MerchantID, rec.Key, rec.Fingerprint, rec.Token, p.Fingerprint, p.Token)
		}
		if rec.State != chargeonce.KeyProcessing || rec.LeaseExpired || rec.RecoveryAttempts != 0 {
			t.Fatalf("%s: state=%s leaseExpired=%v recoveryAttempts=%d, want processing, false, 0",
				what, rec.State, rec.LeaseExpired, rec.RecoveryAttempts)
		}
		if rec.ResponseStatus != 0 || len(rec.ResponseBody) != 0 {
			t.Fatalf("%s: a processing record has response %d %q", what, rec.ResponseStatus, rec.ResponseBody)
		}
		if rec.LeaseRemaining > longLease || !near(rec.LeaseRemaining, longLease) {
			t.Fatalf("%s: LeaseRemaining %v, want just under the %v lease", what, rec.LeaseRemaining, longLease)
		}
		if rec.CreatedAt.IsZero() || !near(rec.LeaseUntil.Sub(rec.CreatedAt), longLease) {
			t.Fatalf("%s: created %v, lease until %v; want lease %v after creation",
				what, rec.CreatedAt, rec.LeaseUntil, longLease)
		}
		// A processing record never expires.
		if !rec.ExpiresAt.IsZero() || rec.ExpiresIn != 0 {
			t.Fatalf("%s: a processing record expires at %v (in %v); want no expiry", what, rec.ExpiresAt, rec.ExpiresIn)
		}
		checkCharge(t, what, rec.Charge, p.Charge, chargeonce.StatusProcessing, "")
	}
	check("KeyInsert", rec)
	got := get(t, s, "m1", "key-1")
	check("KeyGet", got)
	if !got.CreatedAt.Equal(rec.CreatedAt) || !got.LeaseUntil.Equal(rec.LeaseUntil) || !got.ExpiresAt.Equal(rec.ExpiresAt) {
		t.Fatalf("KeyGet times %v/%v/%v differ from KeyInsert's %v/%v/%v",
			got.CreatedAt, got.LeaseUntil, got.ExpiresAt, rec.CreatedAt, rec.LeaseUntil, rec.ExpiresAt)
	}

	ch, err := s.ChargeGet(t.Context(), "m1", p.Charge.ID)
	if err != nil {
		t.Fatalf("ChargeGet: %v", err)
	}
	checkCharge(t, "ChargeGet", ch, p.Charge, chargeonce.StatusProcessing, "")

	_, err = s.KeyGet(t.Context(), "m1", "no-such-key")
	wantCode(t, "KeyGet of a missing key", err, chargeonce.ENOTFOUND)
}

func testInsertExistingReturnsFirst(t *testing.T, s chargeonce.Store) {
	first := newIntent("m1", "key-1")
	insert(t, s, first)

	second := newIntent("m1", "key-1")
	second.Charge.AmountCents = 99 // a different request under the same key
	rec, inserted, err := s.KeyInsert(t.Context(), second)
	if err != nil {
		t.Fatalf("second KeyInsert: %v", err)
	}
	if inserted {
		t.Fatal("second KeyInsert of the same key: inserted=true")
	}
	if rec.Token != first.Token || rec.Fingerprint != first.Fingerprint || rec.State != chargeonce.KeyProcessing {
		t.Fatalf("second KeyInsert returned token %s fp %s state %s, want the first's %s %s processing",
			rec.Token, rec.Fingerprint, rec.State, first.Token, first.Fingerprint)
	}
	checkCharge(t, "second KeyInsert", rec.Charge, first.Charge, chargeonce.StatusProcessing, "")

	_, err = s.ChargeGet(t.Context(), "m1", second.Charge.ID)
	wantCode(t, "ChargeGet of the losing attempt's charge", err, chargeonce.ENOTFOUND)
	charges, err := s.ChargesListByOrder(t.Context(), "m1", first.Charge.OrderID)
	if err != nil || len(charges) != 1 {
		t.Fatalf("ChargesListByOrder: %d charges, err %v; want exactly 1", len(charges), err)
	}
}

func testKeysScopedToMerchant(t *testing.T, s chargeonce.Store) {
	a, b := newIntent("ma", "shared-key"), newIntent("mb", "shared-key")
	insert(t, s, a)
	insert(t, s, b) // same key, another merchant: another intent

	if rec := get(t, s, "ma", "shared-key"); rec.Token != a.Token || rec.Charge.ID != a.Charge.ID {
		t.Fatalf("merchant ma sees token %s charge %s, want %s %s", rec.Token, rec.Charge.ID, a.Token, a.Charge.ID)
	}
	if rec := get(t, s, "mb", "shared-key"); rec.Token != b.Token || rec.Charge.ID != b.Charge.ID {
		t.Fatalf("merchant mb sees token %s charge %s, want %s %s", rec.Token, rec.Charge.ID, b.Token, b.Charge.ID)
	}
	_, err := s.KeyGet(t.Context(), "mc", "shared-key")
	wantCode(t, "KeyGet under a third merchant", err, chargeonce.ENOTFOUND)

	// One merchant's completion never touches the other's record.
	complete(t, s, "ma", "shared-key", a.Token, []byte(`{"merchant":"ma"}`))
	if rec := get(t, s, "mb", "shared-key"); rec.State != chargeonce.KeyProcessing || len(rec.ResponseBody) > 0 {
		t.Fatalf("completing ma's record changed mb's: %+v", rec)
	}
	err = s.KeyComplete(t.Context(), chargeonce.KeyCompleteParams{
		MerchantID: "mb", Key: "shared-key", Token: a.Token,
		ChargeStatus: chargeonce.StatusCaptured, ResponseStatus: 201, ResponseBody: []byte("x"),
	})
	wantCode(t, "KeyComplete of mb's record with ma's token", err, chargeonce.ESTALE)
}

// testInsertRaceOneWinner is the reason the store exists: many attempts
// with one key arrive at once, and exactly one may charge.
func testInsertRaceOneWinner(t *testing.T, s chargeonce.Store) {
	const (
		rounds     = 5
		goroutines = 100
	)
	for round := range rounds {
		key := fmt.Sprintf("race-%d", round)
		orderID := int64(1000 + round)
		type result struct {
			p        chargeonce.KeyInsertParams
			rec      chargeonce.KeyRecord
			inserted bool
			err      error
		}
		results := make([]result, goroutines)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range results {
			p := newIntent("m1", key)
			p.Charge.OrderID = orderID
			results[i].p = p
			wg.Go(func() {
				<-start
				results[i].rec, results[i].inserted, results[i].err = s.KeyInsert(t.Context(), p)
			})
		}
		close(start)
		wg.Wait()

		var winner *result
		for i := range results {
			r := &results[i]
			if r.err != nil {
				t.Fatalf("round %d: KeyInsert %d: %v", round, i, r.err)
			}
			if r.inserted {
				if winner != nil {
					t.Fatalf("round %d: two winners: tokens %s and %s", round, winner.p.Token, r.p.Token)
				}
				winner = r
			}
		}
		if winner == nil {
			t.Fatalf("round %d: no attempt won", round)
		}
		for i, r := range results {
			if r.rec.Token != winner.p.Token || r.rec.Charge.ID != winner.p.Charge.ID || r.rec.Fingerprint != winner.p.Fingerprint {
				t.Fatalf("round %d: attempt %d sees token %s charge %s, want the winner's %s %s",
					round, i, r.rec.Token, r.rec.Charge.ID, winner.p.Token, winner.p.Charge.ID)
			}
		}
		charges, err := s.ChargesListByOrder(t.Context(), "m1", orderID)
		if err != nil {
			t.Fatalf("round %d: ChargesListByOrder: %v", round, err)
		}
		if len(charges) != 1 || charges[0].ID != winner.p.Charge.ID {
			t.Fatalf("round %d: %d charges for the order, want only the winner's %s", round, len(charges), winner.p.Charge.ID)
		}
	}
}

func testCompleteByOwner(t *testing.T, s chargeonce.Store) {
	p := newIntent("m1", "key-1")
	insert(t, s, p)
	body := []byte("{\"id\":\"" + p.Charge.ID + "\",\"status\":\"captured\"}\n")
	complete(t, s, "m1", "key-1", p.Token, body)

	check := func(what string, rec chargeonce.KeyRecord) {
		t.Helper()
		if rec.State != chargeonce.KeyCompleted || rec.ResponseStatus != 201 || !bytes.Equal(rec.ResponseBody, body) {
			t.Fatalf("%s: state %s response %d %q, want completed 201 %q", what, rec.State, rec.ResponseStatus, rec.ResponseBody, body)
		}
		checkCharge(t, what, rec.Charge, p.Charge, chargeonce.StatusCaptured, "")
	}
	check("KeyGet", get(t, s, "m1", "key-1"))

	// A retry gets the stored answer.
	rec, inserted, err := s.KeyInsert(t.Context(), newIntent("m1", "key-1"))
	if err != nil || inserted {
		t.Fatalf("KeyInsert after completion: inserted=%v err=%v", inserted, err)
	}
	check("KeyInsert replay", rec)

	ch, err := s.ChargeGet(t.Context(), "m1", p.Charge.ID)
	if err != nil {
		t.Fatalf("ChargeGet: %v", err)
	}
	checkCharge(t, "ChargeGet", ch, p.Charge, chargeonce.StatusCaptured, "")

	// A completed record is final: not even its owner completes it twice.
	err = s.KeyComplete(t.Context(), chargeonce.KeyCompleteParams{
		MerchantID: "m1", Key: "key-1", Token: p.Token,
		ChargeStatus: chargeonce.StatusDeclined, DeclineCode: "insufficient_funds", ResponseStatus: 402, ResponseBody: []byte("other"),
	})
	wantCode(t, "second KeyComplete", err, chargeonce.ESTALE)
	check("KeyGet after second KeyComplete", get(t, s, "m1", "key-1"))
}

func testCompleteDeclined(t *testing.T, s chargeonce.Store) {
	p := newIntent("m1", "key-1")
	insert(t, s, p)
	body := []byte(`{"type":"https://chargeonce.dev/problems/card-declined","status":402}`)
	err := s.KeyComplete(t.Context(), chargeonce.KeyCompleteParams{
		MerchantID: "m1", Key: "key-1", Token: p.Token,
		ChargeStatus: chargeonce.StatusDeclined, DeclineCode: "insufficient_funds", ResponseStatus: 402, ResponseBody: body,
	})
	if err != nil {
		t.Fatalf("KeyComplete: %v", err)
	}
	rec := get(t, s, "m1", "key-1")
	if rec.State != chargeonce.KeyCompleted || rec.ResponseStatus != 402 || !bytes.Equal(rec.ResponseBody, body) {
		t.Fatalf("state %s response %d %q, want completed 402 %q", rec.State, rec.ResponseStatus, rec.ResponseBody, body)
	}
	checkCharge(t, "KeyGet", rec.Charge, p.Charge, chargeonce.StatusDeclined, "insufficient_funds")
	ch, err := s.ChargeGet(t.Context(), "m1", p.Charge.ID)
	if err != nil {
		t.Fatalf("ChargeGet: %v", err)
	}
	checkCharge(t, "ChargeGet", ch, p.Charge, chargeonce.StatusDeclined, "insufficient_funds")
}

func testCompleteStaleToken(t *testing.T, s chargeonce.Store) {
	p := newIntent("m1", "key-1")
	before := insert(t, s, p)
	err := s.KeyComplete(t.Context(), chargeonce.KeyCompleteParams{
		MerchantID: "m1", Key: "key-1", Token: "tok_not_the_owner",
		ChargeStatus: chargeonce.StatusCaptured, ResponseStatus: 201, ResponseBody: []byte("stolen"),
	})
	wantCode(t, "KeyComplete with a stale token", err, chargeonce.ESTALE)

	after := get(t, s, "m1", "key-1")
	if after.State != chargeonce.KeyProcessing || after.Token != p.Token || after.ResponseStatus != 0 || len(after.ResponseBody) != 0 ||
		!after.LeaseUntil.Equal(before.LeaseUntil) {
		t.Fatalf("stale KeyComplete changed the record: %+v", after)
	}
	checkCharge(t, "KeyGet", after.Charge, p.Charge, chargeonce.StatusProcessing, "")

	err = s.KeyComplete(t.Context(), chargeonce.KeyCompleteParams{
		MerchantID: "m1", Key: "no-such-key", Token: p.Token,
		ChargeStatus: chargeonce.StatusCaptured, ResponseStatus: 201,
	})
	wantCode(t, "KeyComplete of a missing key", err, chargeonce.ESTALE)
}

// testClaimFencesOldToken: once recovery has claimed a record, the attempt
// that lost its lease can no longer write anything.
func testClaimFencesOldToken(t *testing.T, s chargeonce.Store) {
	p := newIntent("m1", "key-1")
	insert(t, s, p)
	// The acquirer's answer was unknown: hand the record to recovery now.
	if err := s.KeyLeaseSet(t.Context(), "m1", "key-1", p.Token, 0, false); err != nil {
		t.Fatalf("KeyLeaseSet: %v", err)
	}
	rec, claimed, err := s.KeyClaim(t.Context(), "m1", "key-1", "tok_recovery", longLease)
	if err != nil || !claimed {
		t.Fatalf("KeyClaim of an expired lease: claimed=%v err=%v", claimed, err)
	}
	if rec.Token != "tok_recovery" || rec.LeaseExpired || !near(rec.LeaseUntil.Sub(rec.CreatedAt), longLease) {
		t.Fatalf("claimed record: token %s leaseExpired %v leaseUntil %v", rec.Token, rec.LeaseExpired, rec.LeaseUntil)
	}
	checkCharge(t, "KeyClaim", rec.Charge, p.Charge, chargeonce.StatusProcessing, "")

	old := chargeonce.KeyCompleteParams{
		MerchantID: "m1", Key: "key-1", Token: p.Token,
		ChargeStatus: chargeonce.StatusCaptured, ResponseStatus: 201, ResponseBody: []byte("late"),
	}
	wantCode(t, "KeyComplete with the pre-claim token", s.KeyComplete(t.Context(), old), chargeonce.ESTALE)
	wantCode(t, "KeyLeaseSet with the pre-claim token", s.KeyLeaseSet(t.Context(), "m1", "key-1", p.Token, longLease, false), chargeonce.ESTALE)
	wantCode(t, "KeyRelease with the pre-claim token", s.KeyRelease(t.Context(), "m1", "key-1", p.Token), chargeonce.ESTALE)
	if got := get(t, s, "m1", "key-1"); got.State != chargeonce.KeyProcessing || got.Token != "tok_recovery" {
		t.Fatalf("after refused writes: state %s token %s, want processing tok_recovery", got.State, got.Token)
	}

	complete(t, s, "m1", "key-1", "tok_recovery", []byte("recovered"))
	got := get(t, s, "m1", "key-1")
	if got.State != chargeonce.KeyCompleted || string(got.ResponseBody) != "recovered" {
		t.Fatalf("after recovery's KeyComplete: state %s body %q", got.State, got.ResponseBody)
	}
	checkCharge(t, "KeyGet", got.Charge, p.Charge, chargeonce.StatusCaptured, "")
}

func testRelease(t *testing.T, s chargeonce.Store) {
	p := newIntent("m1", "key-1")
	insert(t, s, p)
	if err := s.KeyRelease(t.Context(), "m1", "key-1", p.Token); err != nil {
		t.Fatalf("KeyRelease: %v", err)
	}
	_, err := s.KeyGet(t.Context(), "m1", "key-1")
	wantCode(t, "KeyGet after KeyRelease", err, chargeonce.ENOTFOUND)
	_, err = s.ChargeGet(t.Context(), "m1", p.Charge.ID)
	wantCode(t, "ChargeGet after KeyRelease", err, chargeonce.ENOTFOUND)

	// The retry starts afresh.
	retry := newIntent("m1", "key-1")
	rec := insert(t, s, retry)
	if rec.Token != retry.Token || rec.Charge.ID != retry.Charge.ID {
		t.Fatalf("insert after release got token %s charge %s, want %s %s", rec.Token, rec.Charge.ID, retry.Token, retry.Charge.ID)
	}
	wantCode(t, "KeyRelease twice", s.KeyRelease(t.Context(), "m1", "key-1", p.Token), chargeonce.ESTALE)
}

func testReleaseStale(t *testing.T, s chargeonce.Store) {
	p := newIntent("m1", "key-1")
	insert(t, s, p)
	wantCode(t, "KeyRelease with a stale token", s.KeyRelease(t.Context(), "m1", "key-1", "tok_other"), chargeonce.ESTALE)
	if rec := get(t, s, "m1", "key-1"); rec.Token != p.Token || rec.State != chargeonce.KeyProcessing {
		t.Fatalf("stale KeyRelease changed the record: %+v", rec)
	}
	if _, err := s.ChargeGet(t.Context(), "m1", p.Charge.ID); err != nil {
		t.Fatalf("stale KeyRelease removed the charge: %v", err)
	}

	// A completed record is never released, even by its owner: its
	// answer must keep replaying.
	complete(t, s, "m1", "key-1", p.Token, []byte("done"))
	wantCode(t, "KeyRelease of a completed record", s.KeyRelease(t.Context(), "m1", "key-1", p.Token), chargeonce.ESTALE)
	if rec := get(t, s, "m1", "key-1"); rec.State != chargeonce.KeyCompleted {
		t.Fatalf("KeyRelease changed a completed record: %+v", rec)
	}
	wantCode(t, "KeyRelease of a missing key", s.KeyRelease(t.Context(), "m1", "no-such-key", p.Token), chargeonce.ESTALE)
}

func testLeaseSetAndClaim(t *testing.T, s chargeonce.Store) {
	p := newIntent("m1", "key-1")
	insert(t, s, p)

	// The lease is running: recovery must keep off.
	rec, claimed, err := s.KeyClaim(t.Context(), "m1", "key-1", "tok_recovery", longLease)
	if err != nil || claimed {
		t.Fatalf("KeyClaim of a running lease: claimed=%v err=%v, want false, nil", claimed, err)
	}
	if rec.Token != p.Token || rec.State != chargeonce.KeyProcessing {
		t.Fatalf("unclaimed KeyClaim returned token %s state %s, want the current record (%s, processing)", rec.Token, rec.State, p.Token)
	}
	if got := get(t, s, "m1", "key-1"); got.Token != p.Token {
		t.Fatalf("unclaimed KeyClaim changed the token to %s", got.Token)
	}

	// Extending the lease by the owner works and moves lease_until.
	if err := s.KeyLeaseSet(t.Context(), "m1", "key-1", p.Token, 2*longLease, false); err != nil {
		t.Fatalf("KeyLeaseSet: %v", err)
	}
	if got := get(t, s, "m1", "key-1"); !near(got.LeaseUntil.Sub(got.CreatedAt), 2*longLease) || got.LeaseExpired || got.RecoveryAttempts != 0 {
		t.Fatalf("after KeyLeaseSet(2h): lease %v after creation, expired %v, attempts %d", got.LeaseUntil.Sub(got.CreatedAt), got.LeaseExpired, got.RecoveryAttempts)
	}
	// LeaseRemaining is lease_until - now() by the database's clock.
	if got := get(t, s, "m1", "key-1"); got.LeaseRemaining > 2*longLease || !near(got.LeaseRemaining, 2*longLease) {
		t.Fatalf("after KeyLeaseSet(2h): LeaseRemaining %v, want just under %v", got.LeaseRemaining, 2*longLease)
	}

	// Zero: the outcome is unknown, recovery may take over at once.
	if err := s.KeyLeaseSet(t.Context(), "m1", "key-1", p.Token, 0, true); err != nil {
		t.Fatalf("KeyLeaseSet(0): %v", err)
	}
	got := get(t, s, "m1", "key-1")
	if !got.LeaseExpired || got.RecoveryAttempts != 1 || got.LeaseRemaining != 0 {
		t.Fatalf("after KeyLeaseSet(0, true): leaseExpired %v attempts %d remaining %v, want true 1 0", got.LeaseExpired, got.RecoveryAttempts, got.LeaseRemaining)
	}
	rec, claimed, err = s.KeyClaim(t.Context(), "m1", "key-1", "tok_recovery", longLease)
	if err != nil || !claimed {
		t.Fatalf("KeyClaim of an expired lease: claimed=%v err=%v", claimed, err)
	}
	if rec.Token != "tok_recovery" || rec.LeaseExpired || rec.RecoveryAttempts != 1 || rec.Fingerprint != p.Fingerprint {
		t.Fatalf("claimed record: %+v", rec)
	}
	// The new owner counts its recovery attempts.
	if err := s.KeyLeaseSet(t.Context(), "m1", "key-1", "tok_recovery", 0, true); err != nil {
		t.Fatalf("KeyLeaseSet by the new owner: %v", err)
	}
	if got := get(t, s, "m1", "key-1"); got.RecoveryAttempts != 2 || !got.LeaseExpired {
		t.Fatalf("recovery attempts %d leaseExpired %v, want 2 true", got.RecoveryAttempts, got.LeaseExpired)
	}
	wantCode(t, "KeyLeaseSet with a stale token", s.KeyLeaseSet(t.Context(), "m1", "key-1", p.Token, 0, false), chargeonce.ESTALE)
	wantCode(t, "KeyLeaseSet of a missing key", s.KeyLeaseSet(t.Context(), "m1", "no-such-key", p.Token, 0, false), chargeonce.ESTALE)
}

func testClaimNotClaimable(t *testing.T, s chargeonce.Store) {
	p := newIntent("m1", "key-1")
	p.Lease = 0
	insert(t, s, p)
	complete(t, s, "m1", "key-1", p.Token, []byte("done"))
	rec, claimed, err := s.KeyClaim(t.Context(), "m1", "key-1", "tok_recovery", longLease)
	if err != nil || claimed {
		t.Fatalf("KeyClaim of a completed record: claimed=%v err=%v, want false, nil", claimed, err)
	}
	if rec.State != chargeonce.KeyCompleted || rec.Token != p.Token || string(rec.ResponseBody) != "done" {
		t.Fatalf("unclaimed KeyClaim returned %+v, want the completed record", rec)
	}
	_, _, err = s.KeyClaim(t.Context(), "m1", "no-such-key", "tok_recovery", longLease)
	wantCode(t, "KeyClaim of a missing key", err, chargeonce.ENOTFOUND)
}

// testClaimExpiredConcurrentOnce: recovery loops on several instances share
// one backlog without ever claiming a record twice.
func testClaimExpiredConcurrentOnce(t *testing.T, s chargeonce.Store) {
	const (
		records = 50
		loops   = 8
		batch   = 4
	)
	original := map[string]string{} // key -> token at insert
	for i := range records {
		p := newIntent("m1", fmt.Sprintf("orphan-%02d", i))
		p.Lease = 0 // the attempt died: its lease is over
		insert(t, s, p)
		original[p.Charge.IdempotencyKey] = p.Token
	}

	claims := make([][]chargeonce.KeyRecord, loops)
	errs := make([]error, loops)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range loops {
		wg.Go(func() {
			<-start
			for {
				recs, err := s.KeysClaimExpired(t.Context(), longLease, batch)
				if err != nil {
					errs[i] = err
					return
				}
				if len(recs) > batch {
					errs[i] = fmt.Errorf("KeysClaimExpired(limit %d) returned %d records", batch, len(recs))
					return
				}
				if len(recs) == 0 {
					return
				}
				claims[i] = append(claims[i], recs...)
			}
		})
	}
	close(start)
	wg.Wait()

	seen := map[string]int{}
	for i, recs := range claims {
		if errs[i] != nil {
			t.Fatalf("loop %d: %v", i, errs[i])
		}
		for _, rec := range recs {
			if prev, dup := seen[rec.Key]; dup {
				t.Fatalf("record %s claimed by loops %d and %d", rec.Key, prev, i)
			}
			seen[rec.Key] = i
			if rec.Token == original[rec.Key] || rec.Token == "" {
				t.Fatalf("record %s claimed without a fresh token (%q)", rec.Key, rec.Token)
			}
			if rec.LeaseExpired || rec.State != chargeonce.KeyProcessing {
				t.Fatalf("claimed record %s: leaseExpired %v state %s", rec.Key, rec.LeaseExpired, rec.State)
			}
			if got := get(t, s, "m1", rec.Key); got.Token != rec.Token {
				t.Fatalf("record %s: claim returned token %s, stored %s", rec.Key, rec.Token, got.Token)
			}
		}
	}
	if len(seen) != records {
		t.Fatalf("claimed %d records, want %d", len(seen), records)
	}
	recs, err := s.KeysClaimExpired(t.Context(), longLease, records)
	if err != nil || len(recs) != 0 {
		t.Fatalf("KeysClaimExpired after the backlog was claimed: %d records, err %v", len(recs), err)
	}
}

func testClaimExpiredLimitAndSkips(t *testing.T, s chargeonce.Store) {
	expired := map[string]chargeonce.KeyInsertParams{}
	for i := range 3 {
		p := newIntent("m1", fmt.Sprintf("expired-%d", i))
		p.Lease = 0
		insert(t, s, p)
		expired[p.Charge.IdempotencyKey] = p
	}
	running := newIntent("m1", "running") // lease running: not claimable
	insert(t, s, running)
	done := newIntent("m1", "done") // completed: never claimable
	done.Lease = 0
	insert(t, s, done)
	complete(t, s, "m1", "done", done.Token, []byte("done"))

	recs, err := s.KeysClaimExpired(t.Context(), longLease, 2)
	if err != nil || len(recs) != 2 {
		t.Fatalf("KeysClaimExpired(limit 2): %d records, err %v", len(recs), err)
	}
	more, err := s.KeysClaimExpired(t.Context(), longLease, 10)
	if err != nil || len(more) != 1 {
		t.Fatalf("KeysClaimExpired after 2 of 3: %d records, err %v; want the last 1", len(more), err)
	}
	for _, rec := range append(recs, more...) {
		p, ok := expired[rec.Key]
		if !ok {
			t.Fatalf("claimed %s, which was not expired", rec.Key)
		}
		delete(expired, rec.Key)
		checkCharge(t, "claimed "+rec.Key, rec.Charge, p.Charge, chargeonce.StatusProcessing, "")
		if rec.Fingerprint != p.Fingerprint {
			t.Fatalf("claimed %s: fingerprint %s, want %s", rec.Key, rec.Fingerprint, p.Fingerprint)
		}
	}
	if got := get(t, s, "m1", "running"); got.Token != running.Token {
		t.Fatalf("a running lease was claimed: token %s", got.Token)
	}
	if got := get(t, s, "m1", "done"); got.Token != done.Token || got.State != chargeonce.KeyCompleted {
		t.Fatalf("a completed record was claimed: %+v", got)
	}
}

func testDeleteExpiredKeepsCharge(t *testing.T, s chargeonce.Store) {
	old := newIntent("m1", "old")
	insert(t, s, old)
	completeTTL(t, s, "m1", "old", old.Token, []byte("done"), 0) // expires at once
	live := newIntent("m1", "live")
	insert(t, s, live)
	complete(t, s, "m1", "live", live.Token, []byte("done"))

	n, err := s.KeysDeleteExpired(t.Context(), 100)
	if err != nil || n != 1 {
		t.Fatalf("KeysDeleteExpired: deleted %d, err %v; want 1", n, err)
	}
	_, err = s.KeyGet(t.Context(), "m1", "old")
	wantCode(t, "KeyGet of a swept key", err, chargeonce.ENOTFOUND)
	get(t, s, "m1", "live")

	ch, err := s.ChargeGet(t.Context(), "m1", old.Charge.ID)
	if err != nil {
		t.Fatalf("ChargeGet after the sweep: %v (charges are never deleted)", err)
	}
	checkCharge(t, "ChargeGet", ch, old.Charge, chargeonce.StatusCaptured, "")
	if n, err := s.KeysDeleteExpired(t.Context(), 100); err != nil || n != 0 {
		t.Fatalf("second KeysDeleteExpired: deleted %d, err %v; want 0", n, err)
	}
}

func testDeleteExpiredBatches(t *testing.T, s chargeonce.Store) {
	for i := range 5 {
		p := newIntent("m1", fmt.Sprintf("old-%d", i))
		insert(t, s, p)
		completeTTL(t, s, "m1", p.Charge.IdempotencyKey, p.Token, []byte("done"), 0)
	}
	var got []int
	for range 4 {
		n, err := s.KeysDeleteExpired(t.Context(), 2)
		if err != nil {
			t.Fatalf("KeysDeleteExpired: %v", err)
		}
		got = append(got, n)
	}
	if want := []int{2, 2, 1, 0}; !slices.Equal(got, want) {
		t.Fatalf("KeysDeleteExpired(2) deleted %v, want %v", got, want)
	}
}

func testExpiredKeyIsNewIntent(t *testing.T, s chargeonce.Store) {
	old := newIntent("m1", "key-1")
	insert(t, s, old)
	completeTTL(t, s, "m1", "key-1", old.Token, []byte("first"), 0)

	// Not swept yet: the insert itself must treat the record as gone.
	again := newIntent("m1", "key-1")
	rec, inserted, err := s.KeyInsert(t.Context(), again)
	if err != nil || !inserted {
		t.Fatalf("KeyInsert of an expired key: inserted=%v err=%v, want a new intent", inserted, err)
	}
	if rec.Token != again.Token || rec.Charge.ID != again.Charge.ID || rec.State != chargeonce.KeyProcessing || len(rec.ResponseBody) != 0 {
		t.Fatalf("new intent: %+v", rec)
	}
	ch, err := s.ChargeGet(t.Context(), "m1", old.Charge.ID)
	if err != nil {
		t.Fatalf("ChargeGet of the expired intent's charge: %v", err)
	}
	checkCharge(t, "old charge", ch, old.Charge, chargeonce.StatusCaptured, "")
	charges, err := s.ChargesListByOrder(t.Context(), "m1", old.Charge.OrderID)
	if err != nil || len(charges) != 2 {
		t.Fatalf("ChargesListByOrder: %d charges, err %v; want both intents' 2", len(charges), err)
	}
}

// testExpiredProcessingKept: a record still processing is an unsettled
// charge, and never expires. Neither the sweeper nor a reuse of the key may
// drop it: recovery finds charges through their records, and without it a
// charge the acquirer may have captured would stay processing forever.
func testExpiredProcessingKept(t *testing.T, s chargeonce.Store) {
	p := newIntent("m1", "key-1")
	p.Lease = 0
	insert(t, s, p)

	if n, err := s.KeysDeleteExpired(t.Context(), 100); err != nil || n != 0 {
		t.Fatalf("KeysDeleteExpired: deleted %d, err %v; want 0 (the record is unsettled)", n, err)
	}
	rec, inserted, err := s.KeyInsert(t.Context(), newIntent("m1", "key-1"))
	if err != nil || inserted {
		t.Fatalf("KeyInsert over an expired processing record: inserted=%v err=%v, want the existing record", inserted, err)
	}
	if rec.Token != p.Token || rec.Charge.ID != p.Charge.ID || !rec.LeaseExpired {
		t.Fatalf("existing record: token %s charge %s leaseExpired %v", rec.Token, rec.Charge.ID, rec.LeaseExpired)
	}
	recs, err := s.KeysClaimExpired(t.Context(), longLease, 10)
	if err != nil || len(recs) != 1 || recs[0].Key != "key-1" {
		t.Fatalf("KeysClaimExpired: %d records, err %v; want the expired processing record", len(recs), err)
	}

	// Once recovery settles it, it expires like any other.
	completeTTL(t, s, "m1", "key-1", recs[0].Token, []byte("settled"), 0)
	if n, err := s.KeysDeleteExpired(t.Context(), 100); err != nil || n != 1 {
		t.Fatalf("KeysDeleteExpired after settling: deleted %d, err %v; want 1", n, err)
	}
}

// testExpiryStartsAtCompletion: a record expires its TTL after it became
// final, however long it was processing. A charge settled late (recovery,
// after an acquirer outage longer than the TTL) is replayed to the retries
// that come to learn its outcome, for a whole TTL; counted from the insert,
// it would be expired at its settlement, and the retry would charge again.
func testExpiryStartsAtCompletion(t *testing.T, s chargeonce.Store) {
	const ttl = 300 * time.Millisecond
	p := newIntent("m1", "late")
	p.Lease = 0
	insert(t, s, p)
	time.Sleep(2 * ttl) // processing for longer than the TTL
	if n, err := s.KeysDeleteExpired(t.Context(), 100); err != nil || n != 0 {
		t.Fatalf("KeysDeleteExpired while processing: deleted %d, err %v; want 0", n, err)
	}
	recs, err := s.KeysClaimExpired(t.Context(), longLease, 10)
	if err != nil || len(recs) != 1 {
		t.Fatalf("KeysClaimExpired: %d records, err %v; want the late record", len(recs), err)
	}
	completeTTL(t, s, "m1", "late", recs[0].Token, []byte("settled late"), ttl)

	rec := get(t, s, "m1", "late")
	if d := rec.ExpiresAt.Sub(rec.CreatedAt); d < 3*ttl {
		t.Fatalf("expires %v after creation; want the TTL (%v) counted from the completion, over %v after creation", d, ttl, 2*ttl)
	}
	if n, err := s.KeysDeleteExpired(t.Context(), 100); err != nil || n != 0 {
		t.Fatalf("KeysDeleteExpired right after the late completion: deleted %d, err %v; want 0", n, err)
	}
	again, inserted, err := s.KeyInsert(t.Context(), newIntent("m1", "late"))
	if err != nil || inserted || !bytes.Equal(again.ResponseBody, []byte("settled late")) {
		t.Fatalf("KeyInsert right after the late completion: inserted=%v body %q err %v; want the stored answer", inserted, again.ResponseBody, err)
	}
	// A TTL later it expires like any record.
	time.Sleep(time.Until(rec.ExpiresAt) + 50*time.Millisecond)
	if n, err := s.KeysDeleteExpired(t.Context(), 100); err != nil || n != 1 {
		t.Fatalf("KeysDeleteExpired a TTL after the completion: deleted %d, err %v; want 1", n, err)
	}
}

// testExpiresInByDatabaseClock: the store says how long a record has left,
// computed by the database's clock, so that a cache never compares the
// database's ExpiresAt with an instance's clock.
func testExpiresInByDatabaseClock(t *testing.T, s chargeonce.Store) {
	p := newIntent("m1", "kept")
	insert(t, s, p)
	completeTTL(t, s, "m1", "kept", p.Token, []byte("x"), time.Hour)
	rec := get(t, s, "m1", "kept")
	if !near(rec.ExpiresIn, time.Hour) || rec.ExpiresIn > time.Hour {
		t.Fatalf("ExpiresIn %v, want about an hour (at most)", rec.ExpiresIn)
	}
	if replay, inserted, err := s.KeyInsert(t.Context(), newIntent("m1", "kept")); err != nil || inserted || !near(replay.ExpiresIn, time.Hour) {
		t.Fatalf("KeyInsert replay: inserted=%v ExpiresIn %v err %v; want about an hour", inserted, replay.ExpiresIn, err)
	}
	gone := newIntent("m1", "gone")
	insert(t, s, gone)
	completeTTL(t, s, "m1", "gone", gone.Token, []byte("x"), 0)
	if rec := get(t, s, "m1", "gone"); rec.ExpiresIn != 0 || rec.ExpiresAt.IsZero() {
		t.Fatalf("an expired record: ExpiresIn %v ExpiresAt %v; want 0 and its expiry", rec.ExpiresIn, rec.ExpiresAt)
	}
}

func testStuck(t *testing.T, s chargeonce.Store) {
	st, err := s.KeysStuck(t.Context())
	if err != nil || st.Count != 0 || st.OldestAge != 0 {
		t.Fatalf("KeysStuck on an empty store: %+v, err %v; want zero", st, err)
	}

	first := newIntent("m1", "stuck-0")
	first.Lease = 0
	insert(t, s, first)
	const age = 200 * time.Millisecond
	time.Sleep(age)
	for i := 1; i < 3; i++ {
		p := newIntent("m1", fmt.Sprintf("stuck-%d", i))
		p.Lease = 0
		insert(t, s, p)
	}
	insert(t, s, newIntent("m1", "running")) // lease running: not stuck
	done := newIntent("m1", "done")          // completed: not stuck
	done.Lease = 0
	insert(t, s, done)
	complete(t, s, "m1", "done", done.Token, []byte("done"))

	st, err = s.KeysStuck(t.Context())
	if err != nil {
		t.Fatalf("KeysStuck: %v", err)
	}
	if st.Count != 3 {
		t.Fatalf("KeysStuck counted %d, want 3", st.Count)
	}
	// OldestAge is measured from the oldest stuck record's creation.
	if st.OldestAge < age || st.OldestAge > time.Minute {
		t.Fatalf("KeysStuck oldest age %v, want at least %v (since creation) and well under a minute", st.OldestAge, age)
	}

	// A claimed record is being worked on again: not stuck.
	if _, claimed, err := s.KeyClaim(t.Context(), "m1", "stuck-0", "tok_recovery", longLease); err != nil || !claimed {
		t.Fatalf("KeyClaim: claimed=%v err=%v", claimed, err)
	}
	if st, err := s.KeysStuck(t.Context()); err != nil || st.Count != 2 {
		t.Fatalf("KeysStuck after a claim: %+v, err %v; want 2", st, err)
	}
	// Recovery failed and backed it off: its lease lies in the future, but
	// it is stuck all the same (the acquirer is down), and must be counted.
	if err := s.KeyLeaseSet(t.Context(), "m1", "stuck-0", "tok_recovery", time.Minute, true); err != nil {
		t.Fatalf("KeyLeaseSet: %v", err)
	}
	if st, err := s.KeysStuck(t.Context()); err != nil || st.Count != 3 {
		t.Fatalf("KeysStuck after a failed recovery attempt: %+v, err %v; want 3", st, err)
	}
}

func testChargeGetScopedToMerchant(t *testing.T, s chargeonce.Store) {
	p := newIntent("ma", "key-1")
	insert(t, s, p)
	_, err := s.ChargeGet(t.Context(), "mb", p.Charge.ID)
	wantCode(t, "ChargeGet of another merchant's charge", err, chargeonce.ENOTFOUND)
	_, err = s.ChargeGet(t.Context(), "ma", "ch_no_such_charge")
	wantCode(t, "ChargeGet of a missing charge", err, chargeonce.ENOTFOUND)
	if _, err := s.ChargeGet(t.Context(), "ma", p.Charge.ID); err != nil {
		t.Fatalf("ChargeGet by its merchant: %v", err)
	}
}

func testChargesListByOrder(t *testing.T, s chargeonce.Store) {
	// Ids rise with insertion order, so that "newest first" has one answer
	// even on a store whose clock cannot tell the inserts apart (ties go
	// to the larger id).
	prefix := "ch_" + randHex(4) + "_"
	var ids []string
	for i := range 3 {
		p := newIntent("ma", fmt.Sprintf("order-7-%d", i))
		p.Charge.ID = fmt.Sprintf("%s%d", prefix, i)
		p.Charge.OrderID = 7
		insert(t, s, p)
		ids = append(ids, p.Charge.ID)
	}
	other := newIntent("ma", "order-8")
	other.Charge.OrderID = 8
	insert(t, s, other)
	foreign := newIntent("mb", "order-7-elsewhere")
	foreign.Charge.OrderID = 7
	insert(t, s, foreign)

	charges, err := s.ChargesListByOrder(t.Context(), "ma", 7)
	if err != nil {
		t.Fatalf("ChargesListByOrder: %v", err)
	}
	var got []string
	for i, c := range charges {
		got = append(got, c.ID)
		if c.MerchantID != "ma" || c.OrderID != 7 {
			t.Fatalf("charge %s: merchant %s order %d", c.ID, c.MerchantID, c.OrderID)
		}
		if i > 0 && c.CreatedAt.After(charges[i-1].CreatedAt) {
			t.Fatalf("charge %s created after the charge listed before it", c.ID)
		}
	}
	if want := []string{ids[2], ids[1], ids[0]}; !slices.Equal(got, want) {
		t.Fatalf("ChargesListByOrder(ma, 7) = %v, want newest first %v", got, want)
	}
	charges, err = s.ChargesListByOrder(t.Context(), "mb", 7)
	if err != nil || len(charges) != 1 || charges[0].ID != foreign.Charge.ID {
		t.Fatalf("ChargesListByOrder(mb, 7) = %v, err %v; want only %s", charges, err, foreign.Charge.ID)
	}
	charges, err = s.ChargesListByOrder(t.Context(), "ma", 999)
	if err != nil || len(charges) != 0 {
		t.Fatalf("ChargesListByOrder of an order with no charges = %v, err %v; want none", charges, err)
	}
}

// testResponseBodyBytes: a replay must be byte-for-byte what the first
// attempt answered, so the store may not normalize, trim or transcode.
func testResponseBodyBytes(t *testing.T, s chargeonce.Store) {
	large := make([]byte, 64<<10)
	rand.Read(large)
	bodies := map[string][]byte{
		"json-with-whitespace": []byte("{ \"id\" :\t\"ch_1\",\r\n  \"amount_cents\": 25000 }\n\n"),
		"invalid-utf8":         {0xff, 0xfe, 0xfd, 'a', 0xc3, 0x28, 0xa0, 0xa1},
		"nul-bytes":            {0, 0, 'x', 0, '\\', 'x', '0', '0'},
		"trailing-spaces":      []byte("   "),
		"utf8":                 []byte("café ✓ 支付"),
		"single-byte":          {0x80},
		"binary-64KiB":         large,
	}
	for name, body := range bodies {
		key := "body-" + name
		p := newIntent("m1", key)
		insert(t, s, p)
		complete(t, s, "m1", key, p.Token, body)
		if got := get(t, s, "m1", key); !bytes.Equal(got.ResponseBody, body) {
			t.Fatalf("%s: KeyGet returned %d bytes %q, want %d bytes %q", name, len(got.ResponseBody), trunc(got.ResponseBody), len(body), trunc(body))
		}
		rec, inserted, err := s.KeyInsert(t.Context(), newIntent("m1", key))
		if err != nil || inserted {
			t.Fatalf("%s: replay KeyInsert: inserted=%v err=%v", name, inserted, err)
		}
		if !bytes.Equal(rec.ResponseBody, body) {
			t.Fatalf("%s: replay returned %d bytes %q, want %d bytes %q", name, len(rec.ResponseBody), trunc(rec.ResponseBody), len(body), trunc(body))
		}
	}
}

func trunc(b []byte) []byte {
	if len(b) > 64 {
		return b[:64]
	}
	return b
}

func testMigrateAgainAndPing(t *testing.T, s chargeonce.Store) {
	p := newIntent("m1", "key-1")
	insert(t, s, p)
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	if rec := get(t, s, "m1", "key-1"); rec.Token != p.Token {
		t.Fatalf("Migrate changed the data: %+v", rec)
	}
	if err := s.Ping(t.Context()); err != nil {
		t.Fatalf("Ping: %v", err)
	}
}
