package storetest

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
)

// refundTests are the refunds' part of the suite (SPEC "Money going back").
var refundTests = []struct {
	name string
	fn   func(t *testing.T, s chargeonce.Store)
}{
	{"RefundRaceNeverExceedsCaptured", testRefundRaceNeverExceedsCaptured},
	{"RefundSameKeyRaceOneWinner", testRefundSameKeyRaceOneWinner},
	{"RefundOfUncapturedRefused", testRefundOfUncapturedRefused},
	{"RefundDefaultIsRemaining", testRefundDefaultIsRemaining},
	{"RefundFailedGivesBack", testRefundFailedGivesBack},
	{"RefundCompleteByOwnerOnly", testRefundCompleteByOwnerOnly},
	{"RefundRecordsShareRecovery", testRefundRecordsShareRecovery},
	{"RefundKeyExpiresFromSettlement", testRefundKeyExpiresFromSettlement},
	{"RefundKeyNamespaceShared", testRefundKeyNamespaceShared},
	{"RefundsListPaged", testRefundsListPaged},
	{"RefundEventsOnce", testRefundEventsOnce},
}

// capturedCharge inserts and captures a charge of amount for merchant.
func capturedCharge(t *testing.T, s chargeonce.Store, merchant string, amount int64) chargeonce.Charge {
	t.Helper()
	p := newIntent(merchant, "charge-"+randHex(6))
	p.Charge.AmountCents = amount
	insert(t, s, p)
	complete(t, s, merchant, p.Charge.IdempotencyKey, p.Token, []byte(`{"status":"captured"}`))
	ch, err := s.ChargeGet(t.Context(), merchant, p.Charge.ID)
	if err != nil {
		t.Fatalf("ChargeGet: %v", err)
	}
	return ch
}

func newRefund(ch chargeonce.Charge, key string, amount int64) chargeonce.RefundInsertParams {
	return chargeonce.RefundInsertParams{
		Fingerprint: "fp_" + randHex(8),
		Token:       "tok_" + randHex(8),
		Lease:       longLease,
		Refund: chargeonce.Refund{
			ID: "re_" + randHex(8), MerchantID: ch.MerchantID, IdempotencyKey: key,
			ChargeID: ch.ID, AmountCents: amount, Reason: "requested_by_customer",
		},
	}
}

func insertRefund(t *testing.T, s chargeonce.Store, p chargeonce.RefundInsertParams) chargeonce.KeyRecord {
	t.Helper()
	rec, inserted, err := s.RefundInsert(t.Context(), p)
	if err != nil {
		t.Fatalf("RefundInsert(%s): %v", p.Refund.IdempotencyKey, err)
	}
	if !inserted {
		t.Fatalf("RefundInsert(%s): inserted=false for a new key", p.Refund.IdempotencyKey)
	}
	return rec
}

func completeRefund(t *testing.T, s chargeonce.Store, rec chargeonce.KeyRecord, token string, status chargeonce.RefundStatus, ttl time.Duration) error {
	t.Helper()
	return s.KeyComplete(t.Context(), chargeonce.KeyCompleteParams{
		Kind: chargeonce.KindRefund, MerchantID: rec.MerchantID, Key: rec.Key, Token: token,
		RefundStatus: status, ResponseStatus: 201, ResponseBody: []byte(`{"status":"` + string(status) + `"}`), TTL: ttl,
	})
}

// testRefundRaceNeverExceedsCaptured: 50 concurrent refunds of 60 on a
// captured charge of 100, each with its own key: exactly one succeeds, the
// others are refused with EREFUNDEXCEEDS naming the remaining 40, and none
// leaves a record or a refund behind.
func testRefundRaceNeverExceedsCaptured(t *testing.T, s chargeonce.Store) {
	ch := capturedCharge(t, s, "m-race", 100)
	const n = 50
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		won      []chargeonce.KeyRecord
		refused  int
		messages []string
		others   []error
	)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			p := newRefund(ch, "refund-"+randHex(4)+"-"+string(rune('a'+i%26)), 60)
			rec, inserted, err := s.RefundInsert(t.Context(), p)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil && inserted:
				won = append(won, rec)
			case chargeonce.ErrorCode(err) == chargeonce.EREFUNDEXCEEDS:
				refused++
				messages = append(messages, chargeonce.ErrorMessage(err))
			default:
				others = append(others, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	if len(others) > 0 {
		t.Fatalf("%d refunds failed otherwise, first: %v", len(others), others[0])
	}
	if len(won) != 1 || refused != n-1 {
		t.Fatalf("%d refunds of 60 on a capture of 100 succeeded and %d were refused; want 1 and %d", len(won), refused, n-1)
	}
	for _, m := range messages {
		if !strings.Contains(m, "remaining amount_cents is 40") {
			t.Fatalf("refusal %q does not name the remaining amount 40", m)
		}
	}
	page, err := s.RefundsList(t.Context(), chargeonce.RefundsListParams{MerchantID: "m-race", ChargeID: ch.ID, Limit: 100})
	if err != nil {
		t.Fatalf("RefundsList: %v", err)
	}
	if len(page.Refunds) != 1 || page.Refunds[0].AmountCents != 60 || page.Refunds[0].Status != chargeonce.RefundPending {
		t.Fatalf("refunds stored: %+v; want one pending refund of 60", page.Refunds)
	}
	if r := won[0].Refund; r == nil || r.ID != page.Refunds[0].ID || r.Currency != ch.Currency || won[0].Charge.ID != ch.ID {
		t.Fatalf("the winner's record: refund %+v, charge %s; want refund %s of charge %s", r, won[0].Charge.ID, page.Refunds[0].ID, ch.ID)
	}
}

// testRefundSameKeyRaceOneWinner: 50 attempts with one key: one inserts,
// the others get its record, and one refund exists.
func testRefundSameKeyRaceOneWinner(t *testing.T, s chargeonce.Store) {
	ch := capturedCharge(t, s, "m-same", 100)
	const n = 50
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		inserted int
		ids      = map[string]bool{}
	)
	start := make(chan struct{})
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			rec, ins, err := s.RefundInsert(t.Context(), newRefund(ch, "one-key", 30))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("RefundInsert: %v", err)
				return
			}
			if ins {
				inserted++
			}
			if rec.Refund == nil {
				t.Errorf("the record of a refund's key has no refund: %+v", rec)
				return
			}
			ids[rec.Refund.ID] = true
		}()
	}
	close(start)
	wg.Wait()
	if inserted != 1 || len(ids) != 1 {
		t.Fatalf("%d attempts inserted, %d refund ids seen; want 1 and 1", inserted, len(ids))
	}
	page, err := s.RefundsList(t.Context(), chargeonce.RefundsListParams{MerchantID: "m-same", Limit: 100})
	if err != nil || len(page.Refunds) != 1 {
		t.Fatalf("RefundsList: %d refunds, %v; want 1", len(page.Refunds), err)
	}
}

func testRefundOfUncapturedRefused(t *testing.T, s chargeonce.Store) {
	processing := newIntent("m-unc", "processing")
	insert(t, s, processing)
	declined := newIntent("m-unc", "declined")
	insert(t, s, declined)
	if err := s.KeyComplete(t.Context(), chargeonce.KeyCompleteParams{
		MerchantID: "m-unc", Key: "declined", Token: declined.Token,
		ChargeStatus: chargeonce.StatusDeclined, DeclineCode: "insufficient_funds", ResponseStatus: 402, ResponseBody: []byte(`{}`), TTL: longTTL,
	}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []chargeonce.Charge{processing.Charge, declined.Charge} {
		_, _, err := s.RefundInsert(t.Context(), newRefund(c, "refund-of-"+c.IdempotencyKey, 10))
		wantCode(t, "refund of a "+c.IdempotencyKey+" charge", err, chargeonce.ENOTREFUNDABLE)
		if _, err := s.KeyGet(t.Context(), "m-unc", "refund-of-"+c.IdempotencyKey); chargeonce.ErrorCode(err) != chargeonce.ENOTFOUND {
			t.Fatalf("a refused refund left its key behind: %v", err)
		}
	}
	_, _, err := s.RefundInsert(t.Context(), newRefund(chargeonce.Charge{ID: "ch_nope", MerchantID: "m-unc"}, "refund-of-nothing", 10))
	wantCode(t, "refund of no charge", err, chargeonce.ENOTFOUND)
	// Another merchant's captured charge is not found either.
	other := capturedCharge(t, s, "m-other", 100)
	other.MerchantID = "m-unc"
	_, _, err = s.RefundInsert(t.Context(), newRefund(other, "refund-of-others", 10))
	wantCode(t, "refund of another merchant's charge", err, chargeonce.ENOTFOUND)
}

func testRefundDefaultIsRemaining(t *testing.T, s chargeonce.Store) {
	ch := capturedCharge(t, s, "m-def", 100)
	insertRefund(t, s, newRefund(ch, "part", 30))
	rec := insertRefund(t, s, newRefund(ch, "rest", 0))
	if rec.Refund.AmountCents != 70 {
		t.Fatalf("a refund without an amount refunded %d; want the remaining 70", rec.Refund.AmountCents)
	}
	_, _, err := s.RefundInsert(t.Context(), newRefund(ch, "nothing-left", 0))
	wantCode(t, "refund of the rest when nothing remains", err, chargeonce.EREFUNDEXCEEDS)
	if !strings.Contains(chargeonce.ErrorMessage(err), "remaining amount_cents is 0") {
		t.Fatalf("refusal %q does not name the remaining 0", chargeonce.ErrorMessage(err))
	}
	_, _, err = s.RefundInsert(t.Context(), newRefund(ch, "one-more", 1))
	wantCode(t, "refund past the capture", err, chargeonce.EREFUNDEXCEEDS)
}

func testRefundFailedGivesBack(t *testing.T, s chargeonce.Store) {
	ch := capturedCharge(t, s, "m-fail", 100)
	p := newRefund(ch, "fails", 80)
	rec := insertRefund(t, s, p)
	_, _, err := s.RefundInsert(t.Context(), newRefund(ch, "too-much-while-pending", 30))
	wantCode(t, "refund of 30 beside a pending 80", err, chargeonce.EREFUNDEXCEEDS)
	if err := completeRefund(t, s, rec, p.Token, chargeonce.RefundFailed, longTTL); err != nil {
		t.Fatalf("completing failed: %v", err)
	}
	rf, err := s.RefundGet(t.Context(), "m-fail", p.Refund.ID)
	if err != nil || rf.Status != chargeonce.RefundFailed {
		t.Fatalf("RefundGet after failure: %+v, %v; want failed", rf, err)
	}
	// The failed 80 no longer counts: 100 may be refunded again.
	rec2 := insertRefund(t, s, newRefund(ch, "after-failure", 100))
	if rec2.Refund.AmountCents != 100 {
		t.Fatalf("refund after a failed one: %d; want 100", rec2.Refund.AmountCents)
	}
	// A succeeded refund keeps counting.
	if err := completeRefund(t, s, rec2, rec2.Token, chargeonce.RefundSucceeded, longTTL); err != nil {
		t.Fatal(err)
	}
	_, _, err = s.RefundInsert(t.Context(), newRefund(ch, "after-full", 1))
	wantCode(t, "refund after a full succeeded refund", err, chargeonce.EREFUNDEXCEEDS)
}

func testRefundCompleteByOwnerOnly(t *testing.T, s chargeonce.Store) {
	ch := capturedCharge(t, s, "m-own", 100)
	p := newRefund(ch, "owned", 50)
	rec := insertRefund(t, s, p)
	wantCode(t, "completing with another token", completeRefund(t, s, rec, "tok_other", chargeonce.RefundSucceeded, longTTL), chargeonce.ESTALE)
	if err := completeRefund(t, s, rec, p.Token, chargeonce.RefundSucceeded, longTTL); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "completing twice", completeRefund(t, s, rec, p.Token, chargeonce.RefundFailed, longTTL), chargeonce.ESTALE)
	got := get(t, s, "m-own", "owned")
	if got.State != chargeonce.KeyCompleted || got.ResponseStatus != 201 || string(got.ResponseBody) != `{"status":"succeeded"}` {
		t.Fatalf("completed refund record: state %s, %d %q", got.State, got.ResponseStatus, got.ResponseBody)
	}
	if got.Refund == nil || got.Refund.Status != chargeonce.RefundSucceeded || got.Charge.ID != ch.ID {
		t.Fatalf("KeyGet of a refund's key: refund %+v, charge %s", got.Refund, got.Charge.ID)
	}
}

// testRefundRecordsShareRecovery: a refund's record whose lease ended is
// claimed by KeysClaimExpired beside charges', as a refund, and by KeyClaim.
func testRefundRecordsShareRecovery(t *testing.T, s chargeonce.Store) {
	ch := capturedCharge(t, s, "m-rec", 100)
	p := newRefund(ch, "stuck", 25)
	insertRefund(t, s, p)
	if err := s.KeyLeaseSet(t.Context(), "m-rec", "stuck", p.Token, 0, true); err != nil {
		t.Fatal(err)
	}
	st, err := s.KeysStuck(t.Context())
	if err != nil || st.Count != 1 {
		t.Fatalf("KeysStuck: %+v, %v; want the stuck refund counted", st, err)
	}
	recs, err := s.KeysClaimExpired(t.Context(), longLease, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].Kind() != chargeonce.KindRefund || recs[0].Refund.ID != p.Refund.ID || recs[0].Reference() != p.Refund.ID {
		t.Fatalf("claimed %+v; want the refund's record", recs)
	}
	if recs[0].Age < 0 || recs[0].Age > time.Minute {
		t.Fatalf("a new refund's record has age %v", recs[0].Age)
	}
	// Its new owner completes it; the old token cannot.
	wantCode(t, "completing with the fenced token", completeRefund(t, s, recs[0], p.Token, chargeonce.RefundSucceeded, longTTL), chargeonce.ESTALE)
	if err := s.KeyLeaseSet(t.Context(), "m-rec", "stuck", recs[0].Token, 0, true); err != nil {
		t.Fatal(err)
	}
	claimed, ok, err := s.KeyClaim(t.Context(), "m-rec", "stuck", "tok_retry", longLease)
	if err != nil || !ok || claimed.Refund == nil || claimed.Refund.ID != p.Refund.ID {
		t.Fatalf("KeyClaim: %+v ok=%v err=%v; want the refund claimed", claimed.Refund, ok, err)
	}
	if err := completeRefund(t, s, claimed, "tok_retry", chargeonce.RefundSucceeded, longTTL); err != nil {
		t.Fatal(err)
	}
}

func testRefundKeyExpiresFromSettlement(t *testing.T, s chargeonce.Store) {
	ch := capturedCharge(t, s, "m-ttl", 100)
	p := newRefund(ch, "short", 10)
	rec := insertRefund(t, s, p)
	if err := completeRefund(t, s, rec, p.Token, chargeonce.RefundSucceeded, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	// A key reused after its record expired is a new refund, even before
	// the sweeper has been by.
	again := newRefund(ch, "short", 10)
	if rec, inserted, err := s.RefundInsert(t.Context(), again); err != nil || !inserted || rec.Refund.ID != again.Refund.ID {
		t.Fatalf("RefundInsert with an expired refund's key: inserted=%v, %v; want a new refund", inserted, err)
	}
	if err := completeRefund(t, s, get(t, s, "m-ttl", "short"), again.Token, chargeonce.RefundSucceeded, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	if _, err := s.KeysDeleteExpired(t.Context(), 100); err != nil {
		t.Fatal(err)
	}
	if _, err := s.KeyGet(t.Context(), "m-ttl", "short"); chargeonce.ErrorCode(err) != chargeonce.ENOTFOUND {
		t.Fatalf("an expired refund key is still there: %v", err)
	}
	if rf, err := s.RefundGet(t.Context(), "m-ttl", p.Refund.ID); err != nil || rf.Status != chargeonce.RefundSucceeded {
		t.Fatalf("the refund went with its key: %+v, %v", rf, err)
	}
	// A processing refund never expires.
	q := newRefund(ch, "pending", 10)
	insertRefund(t, s, q)
	if _, err := s.KeysDeleteExpired(t.Context(), 100); err != nil {
		t.Fatal(err)
	}
	if got := get(t, s, "m-ttl", "pending"); got.State != chargeonce.KeyProcessing {
		t.Fatalf("pending refund's record: %s", got.State)
	}
}

// testRefundKeyNamespaceShared: a merchant's keys are one namespace: a
// charge's key sent to refund reads the charge's record (the engine then
// answers 422), and a refund's key sent to charge reads the refund's.
func testRefundKeyNamespaceShared(t *testing.T, s chargeonce.Store) {
	ch := capturedCharge(t, s, "m-ns", 100)
	rec, inserted, err := s.RefundInsert(t.Context(), newRefund(ch, ch.IdempotencyKey, 10))
	if err != nil || inserted || rec.Refund != nil || rec.Charge.ID != ch.ID {
		t.Fatalf("refund with the charge's key: inserted=%v refund=%v charge=%s err=%v; want the charge's record", inserted, rec.Refund, rec.Charge.ID, err)
	}
	p := newRefund(ch, "refund-key", 10)
	insertRefund(t, s, p)
	c := newIntent("m-ns", "refund-key")
	rec, inserted, err = s.KeyInsert(t.Context(), c)
	if err != nil || inserted || rec.Refund == nil || rec.Refund.ID != p.Refund.ID || rec.Fingerprint != p.Fingerprint {
		t.Fatalf("charge with a refund's key: inserted=%v refund=%v err=%v; want the refund's record", inserted, rec.Refund, err)
	}
}

func testRefundsListPaged(t *testing.T, s chargeonce.Store) {
	ch := capturedCharge(t, s, "m-list", 1000)
	other := capturedCharge(t, s, "m-list", 1000)
	var ids []string
	for i := range 5 {
		rec := insertRefund(t, s, newRefund(ch, "l-"+string(rune('a'+i)), 10))
		ids = append(ids, rec.Refund.ID)
		time.Sleep(2 * time.Millisecond)
	}
	insertRefund(t, s, newRefund(other, "l-other", 10))
	var got []string
	after := ""
	for pages := 0; ; pages++ {
		page, err := s.RefundsList(t.Context(), chargeonce.RefundsListParams{MerchantID: "m-list", ChargeID: ch.ID, Limit: 2, StartingAfter: after})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range page.Refunds {
			got = append(got, r.ID)
		}
		if !page.HasMore {
			break
		}
		after = page.Refunds[len(page.Refunds)-1].ID
		if pages > 5 {
			t.Fatal("too many pages")
		}
	}
	want := []string{ids[4], ids[3], ids[2], ids[1], ids[0]}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("refunds of the charge, paged: %v; want newest first %v", got, want)
	}
	all, err := s.RefundsList(t.Context(), chargeonce.RefundsListParams{MerchantID: "m-list", Limit: 100})
	if err != nil || len(all.Refunds) != 6 {
		t.Fatalf("all the merchant's refunds: %d, %v; want 6", len(all.Refunds), err)
	}
	_, err = s.RefundsList(t.Context(), chargeonce.RefundsListParams{MerchantID: "m-other", Limit: 2, StartingAfter: ids[0]})
	wantCode(t, "another merchant's cursor", err, chargeonce.EINVALID)
}

// testRefundEventsOnce: a refund's insert writes refund.created, its
// settlement refund.updated and charge.refunded (succeeded) or
// refund.failed, each once, beside the charge's own event.
func testRefundEventsOnce(t *testing.T, s chargeonce.Store) {
	ch := capturedCharge(t, s, "m-ev", 100)
	types := func() map[string]int {
		t.Helper()
		page, err := s.WebhookEventsList(t.Context(), chargeonce.EventsListParams{MerchantID: "m-ev", ChargeID: ch.ID, Limit: 100})
		if err != nil {
			t.Fatalf("WebhookEventsList: %v", err)
		}
		got := map[string]int{}
		for _, ev := range page.Events {
			got[ev.Type]++
		}
		return got
	}
	ok := newRefund(ch, "ev-ok", 40)
	okRec := insertRefund(t, s, ok)
	bad := newRefund(ch, "ev-bad", 30)
	badRec := insertRefund(t, s, bad)
	if got := types(); got["refund.created"] != 2 || got["charge.captured"] != 1 || len(got) != 2 {
		t.Fatalf("events after two refunds inserted: %v; want charge.captured 1, refund.created 2", got)
	}
	if err := completeRefund(t, s, okRec, ok.Token, chargeonce.RefundSucceeded, longTTL); err != nil {
		t.Fatal(err)
	}
	if err := completeRefund(t, s, badRec, bad.Token, chargeonce.RefundFailed, longTTL); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"charge.captured": 1, "refund.created": 2, "refund.updated": 1, "charge.refunded": 1, "refund.failed": 1}
	got := types()
	for k, n := range want {
		if got[k] != n {
			t.Fatalf("events after settling: %v; want %v", got, want)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("events after settling: %v; want %v", got, want)
	}
}
