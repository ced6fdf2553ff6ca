package storetest

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
)

// operationTests are the manual capture's part of the suite (SPEC "Money
// going back"): captures and cancels of authorizations.
var operationTests = []struct {
	name string
	fn   func(t *testing.T, s chargeonce.Store)
}{
	{"ManualChargeAuthorizes", testManualChargeAuthorizes},
	{"CaptureRaceOneWinner", testCaptureRaceOneWinner},
	{"CaptureRacesCancelOneWinner", testCaptureRacesCancelOneWinner},
	{"CaptureSameKeyRaceOneWinner", testCaptureSameKeyRaceOneWinner},
	{"CaptureRefusalsWriteNothing", testCaptureRefusalsWriteNothing},
	{"CaptureFailedFreesCharge", testCaptureFailedFreesCharge},
	{"CaptureBoundsRefunds", testCaptureBoundsRefunds},
	{"OperationRecordsShareRecovery", testOperationRecordsShareRecovery},
	{"OperationEventsOnce", testOperationEventsOnce},
	{"AuthorizationsExpired", testAuthorizationsExpired},
}

// authorizedCharge inserts a manual charge of amount for merchant and
// settles it authorized.
func authorizedCharge(t *testing.T, s chargeonce.Store, merchant string, amount int64) chargeonce.Charge {
	t.Helper()
	p := newIntent(merchant, "auth-"+randHex(6))
	p.Charge.AmountCents = amount
	p.Charge.CaptureMethod = chargeonce.CaptureManual
	rec := insert(t, s, p)
	if rec.Charge.CaptureMethod != chargeonce.CaptureManual {
		t.Fatalf("KeyInsert of a manual charge: record's charge has capture method %q", rec.Charge.CaptureMethod)
	}
	err := s.KeyComplete(t.Context(), chargeonce.KeyCompleteParams{
		MerchantID: merchant, Key: p.Charge.IdempotencyKey, Token: p.Token,
		ChargeStatus: chargeonce.StatusAuthorized, ResponseStatus: 201, ResponseBody: []byte(`{"status":"authorized"}`), TTL: longTTL,
	})
	if err != nil {
		t.Fatalf("KeyComplete(authorized): %v", err)
	}
	ch, err := s.ChargeGet(t.Context(), merchant, p.Charge.ID)
	if err != nil {
		t.Fatalf("ChargeGet: %v", err)
	}
	return ch
}

func newOperation(ch chargeonce.Charge, kind chargeonce.RecordKind, key string, amount int64) chargeonce.OperationInsertParams {
	prefix := "cp_"
	if kind == chargeonce.KindCancel {
		prefix = "vd_"
	}
	return chargeonce.OperationInsertParams{
		Fingerprint: "fp_" + randHex(8),
		Token:       "tok_" + randHex(8),
		Lease:       longLease,
		Operation: chargeonce.Operation{
			ID: prefix + randHex(8), Kind: kind, MerchantID: ch.MerchantID, IdempotencyKey: key,
			ChargeID: ch.ID, AmountCents: amount,
		},
	}
}

func insertOperation(t *testing.T, s chargeonce.Store, p chargeonce.OperationInsertParams) chargeonce.KeyRecord {
	t.Helper()
	rec, inserted, err := s.OperationInsert(t.Context(), p)
	if err != nil {
		t.Fatalf("OperationInsert(%s %s): %v", p.Operation.Kind, p.Operation.IdempotencyKey, err)
	}
	if !inserted {
		t.Fatalf("OperationInsert(%s): inserted=false for a new key", p.Operation.IdempotencyKey)
	}
	return rec
}

func completeOperation(t *testing.T, s chargeonce.Store, rec chargeonce.KeyRecord, token string, status chargeonce.OperationStatus) error {
	t.Helper()
	return s.KeyComplete(t.Context(), chargeonce.KeyCompleteParams{
		Kind: rec.Kind(), MerchantID: rec.MerchantID, Key: rec.Key, Token: token,
		OperationStatus: status, ResponseStatus: 200, ResponseBody: []byte(`{"status":"` + string(status) + `"}`), TTL: longTTL,
	})
}

func chargeNow(t *testing.T, s chargeonce.Store, ch chargeonce.Charge) chargeonce.Charge {
	t.Helper()
	got, err := s.ChargeGet(t.Context(), ch.MerchantID, ch.ID)
	if err != nil {
		t.Fatalf("ChargeGet: %v", err)
	}
	return got
}

// testManualChargeAuthorizes: a manual charge is stored with its capture
// method, settles authorized, reads back so by key, by id and in lists,
// and an automatic one still has no capture method.
func testManualChargeAuthorizes(t *testing.T, s chargeonce.Store) {
	ch := authorizedCharge(t, s, "m-auth", 100)
	if ch.Status != chargeonce.StatusAuthorized || ch.CaptureMethod != chargeonce.CaptureManual || ch.CapturedCents != 0 || ch.AmountCaptured() != 0 {
		t.Fatalf("authorized charge: %+v", ch)
	}
	rec := get(t, s, "m-auth", ch.IdempotencyKey)
	if rec.Charge.Status != chargeonce.StatusAuthorized || rec.Charge.CaptureMethod != chargeonce.CaptureManual || rec.Operation != nil {
		t.Fatalf("record of an authorized charge: %+v", rec.Charge)
	}
	page, err := s.ChargesList(t.Context(), chargeonce.ChargesListParams{MerchantID: "m-auth", Status: chargeonce.StatusAuthorized, Limit: 10})
	if err != nil {
		t.Fatalf("ChargesList(authorized): %v", err)
	}
	if len(page.Charges) != 1 || page.Charges[0].ID != ch.ID || page.Charges[0].CaptureMethod != chargeonce.CaptureManual {
		t.Fatalf("ChargesList(authorized): %+v", page.Charges)
	}
	auto := capturedCharge(t, s, "m-auth", 100)
	if auto.CaptureMethod != "" || auto.AmountCaptured() != 100 {
		t.Fatalf("automatic charge: %+v", auto)
	}
}

// race runs n operations of ch concurrently, each with its own key, kinds
// alternating as kinds lists them, and returns the winners and refusals.
func race(t *testing.T, s chargeonce.Store, ch chargeonce.Charge, n int, amount int64, kinds ...chargeonce.RecordKind) (won []chargeonce.KeyRecord, refused []string) {
	t.Helper()
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		others []error
	)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			p := newOperation(ch, kinds[i%len(kinds)], "op-"+randHex(6), amount)
			rec, inserted, err := s.OperationInsert(t.Context(), p)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil && inserted:
				won = append(won, rec)
			case chargeonce.ErrorCode(err) == chargeonce.ENOTAUTHORIZED:
				refused = append(refused, chargeonce.ErrorMessage(err))
			default:
				others = append(others, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	if len(others) > 0 {
		t.Fatalf("%d operations failed otherwise, first: %v", len(others), others[0])
	}
	return won, refused
}

// testCaptureRaceOneWinner: 50 concurrent captures of one authorization,
// each with its own key: exactly one is inserted, the others are refused
// (ENOTAUTHORIZED naming the capture in progress) and leave no record.
func testCaptureRaceOneWinner(t *testing.T, s chargeonce.Store) {
	ch := authorizedCharge(t, s, "m-crace", 100)
	const n = 50
	won, refused := race(t, s, ch, n, 60, chargeonce.KindCapture)
	if len(won) != 1 || len(refused) != n-1 {
		t.Fatalf("%d captures inserted and %d refused; want 1 and %d", len(won), len(refused), n-1)
	}
	for _, m := range refused {
		if !strings.Contains(m, "capture") {
			t.Fatalf("refusal %q does not name the capture holding the charge", m)
		}
	}
	if op := won[0].Operation; op == nil || op.Kind != chargeonce.KindCapture || op.AmountCents != 60 ||
		op.Status != chargeonce.OperationPending || op.Currency != ch.Currency || won[0].Charge.ID != ch.ID {
		t.Fatalf("the winner's record: %+v (charge %s)", won[0].Operation, won[0].Charge.ID)
	}
	if err := completeOperation(t, s, won[0], won[0].Token, chargeonce.OperationSucceeded); err != nil {
		t.Fatalf("completing the capture: %v", err)
	}
	got := chargeNow(t, s, ch)
	if got.Status != chargeonce.StatusCaptured || got.CapturedCents != 60 || got.AmountCaptured() != 60 || got.AmountCents != 100 {
		t.Fatalf("charge after its capture of 60: %+v", got)
	}
	// Captured once: a later capture or cancel is refused.
	_, _, err := s.OperationInsert(t.Context(), newOperation(ch, chargeonce.KindCapture, "late-capture", 0))
	wantCode(t, "capture of a captured charge", err, chargeonce.ENOTAUTHORIZED)
	_, _, err = s.OperationInsert(t.Context(), newOperation(ch, chargeonce.KindCancel, "late-cancel", 0))
	wantCode(t, "cancel of a captured charge", err, chargeonce.ENOTAUTHORIZED)
}

// testCaptureRacesCancelOneWinner: captures and cancels of one
// authorization, concurrently: exactly one of them wins.
func testCaptureRacesCancelOneWinner(t *testing.T, s chargeonce.Store) {
	for range 5 {
		ch := authorizedCharge(t, s, "m-cvc", 100)
		const n = 20
		won, refused := race(t, s, ch, n, 0, chargeonce.KindCapture, chargeonce.KindCancel)
		if len(won) != 1 || len(refused) != n-1 {
			t.Fatalf("%d operations inserted and %d refused; want 1 and %d", len(won), len(refused), n-1)
		}
		if err := completeOperation(t, s, won[0], won[0].Token, chargeonce.OperationSucceeded); err != nil {
			t.Fatal(err)
		}
		want := chargeonce.StatusCaptured
		if won[0].Kind() == chargeonce.KindCancel {
			want = chargeonce.StatusCanceled
		}
		if got := chargeNow(t, s, ch); got.Status != want {
			t.Fatalf("charge after its %s won: %s; want %s", won[0].Kind(), got.Status, want)
		}
	}
}

// testCaptureSameKeyRaceOneWinner: 30 attempts with one key: one inserts,
// the others get its record.
func testCaptureSameKeyRaceOneWinner(t *testing.T, s chargeonce.Store) {
	ch := authorizedCharge(t, s, "m-csame", 100)
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		tokens = map[string]int{}
		ins    int
		errs   []error
	)
	for range 30 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec, inserted, err := s.OperationInsert(t.Context(), newOperation(ch, chargeonce.KindCapture, "same", 50))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			if inserted {
				ins++
			}
			if rec.Operation == nil {
				errs = append(errs, nil)
				return
			}
			tokens[rec.Token]++
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d attempts failed (or read no operation), first: %v", len(errs), errs[0])
	}
	if ins != 1 || len(tokens) != 1 {
		t.Fatalf("%d inserted, %d distinct records seen; want 1 and 1", ins, len(tokens))
	}
}

// testCaptureRefusalsWriteNothing: a capture past the authorized amount,
// of an automatic (captured) charge, of another merchant's charge, of a
// declined or processing one, and a cancel of a captured one: each refused
// with its code, and none leaves a record.
func testCaptureRefusalsWriteNothing(t *testing.T, s chargeonce.Store) {
	ch := authorizedCharge(t, s, "m-cref", 100)
	p := newOperation(ch, chargeonce.KindCapture, "too-much", 101)
	_, _, err := s.OperationInsert(t.Context(), p)
	wantCode(t, "capture of 101 of 100", err, chargeonce.ECAPTUREEXCEEDS)
	if m := chargeonce.ErrorMessage(err); !strings.Contains(m, "100") {
		t.Fatalf("refusal %q does not name the authorized amount", m)
	}
	_, err = s.KeyGet(t.Context(), "m-cref", "too-much")
	wantCode(t, "the refused capture's record", err, chargeonce.ENOTFOUND)

	auto := capturedCharge(t, s, "m-cref", 100)
	_, _, err = s.OperationInsert(t.Context(), newOperation(auto, chargeonce.KindCapture, "auto", 0))
	wantCode(t, "capture of an automatic charge", err, chargeonce.ENOTAUTHORIZED)
	_, _, err = s.OperationInsert(t.Context(), newOperation(auto, chargeonce.KindCancel, "auto-cancel", 0))
	wantCode(t, "cancel of a captured charge", err, chargeonce.ENOTAUTHORIZED)

	other := ch
	other.MerchantID = "m-other"
	_, _, err = s.OperationInsert(t.Context(), newOperation(other, chargeonce.KindCapture, "other", 0))
	wantCode(t, "capture of another merchant's charge", err, chargeonce.ENOTFOUND)

	pp := newIntent("m-cref", "processing")
	pp.Charge.CaptureMethod = chargeonce.CaptureManual
	insert(t, s, pp)
	_, _, err = s.OperationInsert(t.Context(), newOperation(pp.Charge, chargeonce.KindCapture, "of-processing", 0))
	wantCode(t, "capture of a processing charge", err, chargeonce.ENOTAUTHORIZED)
	for _, key := range []string{"auto", "auto-cancel", "other", "of-processing"} {
		if _, err := s.KeyGet(t.Context(), "m-cref", key); chargeonce.ErrorCode(err) != chargeonce.ENOTFOUND {
			t.Fatalf("refused operation %s left a record: %v", key, err)
		}
	}
	if got := chargeNow(t, s, ch); got.Status != chargeonce.StatusAuthorized {
		t.Fatalf("charge after refusals: %s; want authorized", got.Status)
	}
}

// testCaptureFailedFreesCharge: a capture the acquirer refused leaves the
// charge authorized, and another capture may follow; a cancel that
// succeeded settles it canceled.
func testCaptureFailedFreesCharge(t *testing.T, s chargeonce.Store) {
	ch := authorizedCharge(t, s, "m-cfail", 100)
	p := newOperation(ch, chargeonce.KindCapture, "fails", 0)
	rec := insertOperation(t, s, p)
	if rec.Operation.AmountCents != 100 {
		t.Fatalf("capture with no amount: %d; want the authorized 100", rec.Operation.AmountCents)
	}
	if err := completeOperation(t, s, rec, "tok_not_the_owner", chargeonce.OperationFailed); chargeonce.ErrorCode(err) != chargeonce.ESTALE {
		t.Fatalf("completing as another token: %v; want ESTALE", err)
	}
	if err := completeOperation(t, s, rec, p.Token, chargeonce.OperationFailed); err != nil {
		t.Fatal(err)
	}
	if got := chargeNow(t, s, ch); got.Status != chargeonce.StatusAuthorized {
		t.Fatalf("charge after a failed capture: %s; want authorized", got.Status)
	}
	c := newOperation(ch, chargeonce.KindCancel, "cancel", 0)
	crec := insertOperation(t, s, c)
	if err := completeOperation(t, s, crec, c.Token, chargeonce.OperationSucceeded); err != nil {
		t.Fatal(err)
	}
	if got := chargeNow(t, s, ch); got.Status != chargeonce.StatusCanceled || got.CapturedCents != 0 {
		t.Fatalf("charge after its cancel: %+v", got)
	}
	done := get(t, s, "m-cfail", "cancel")
	if done.State != chargeonce.KeyCompleted || done.Operation == nil || done.Operation.Status != chargeonce.OperationSucceeded || done.Charge.Status != chargeonce.StatusCanceled {
		t.Fatalf("the cancel's record: %+v", done)
	}
}

// testCaptureBoundsRefunds: a manual charge of 100 captured for 60 can be
// refunded 60 at most, and a refund of the authorization is refused.
func testCaptureBoundsRefunds(t *testing.T, s chargeonce.Store) {
	ch := authorizedCharge(t, s, "m-cbound", 100)
	_, _, err := s.RefundInsert(t.Context(), newRefund(ch, "before", 10))
	wantCode(t, "refund of an authorization", err, chargeonce.ENOTREFUNDABLE)
	p := newOperation(ch, chargeonce.KindCapture, "cap", 60)
	rec := insertOperation(t, s, p)
	if err := completeOperation(t, s, rec, p.Token, chargeonce.OperationSucceeded); err != nil {
		t.Fatal(err)
	}
	_, _, err = s.RefundInsert(t.Context(), newRefund(ch, "seventy", 70))
	wantCode(t, "refund of 70 of a capture of 60", err, chargeonce.EREFUNDEXCEEDS)
	if m := chargeonce.ErrorMessage(err); !strings.Contains(m, "remaining amount_cents is 60") {
		t.Fatalf("refusal %q does not name the remaining 60", m)
	}
	r := insertRefund(t, s, newRefund(ch, "rest", 0))
	if r.Refund.AmountCents != 60 {
		t.Fatalf("refund of the rest: %d; want the captured 60", r.Refund.AmountCents)
	}
}

// testOperationRecordsShareRecovery: an operation's record is claimed by
// KeysClaimExpired and KeyClaim with its operation and charge.
func testOperationRecordsShareRecovery(t *testing.T, s chargeonce.Store) {
	ch := authorizedCharge(t, s, "m-crec", 100)
	p := newOperation(ch, chargeonce.KindCapture, "orphan", 40)
	insertOperation(t, s, p)
	if err := s.KeyLeaseSet(t.Context(), "m-crec", "orphan", p.Token, 0, false); err != nil {
		t.Fatal(err)
	}
	recs, err := s.KeysClaimExpired(t.Context(), longLease, 100)
	if err != nil {
		t.Fatal(err)
	}
	var found *chargeonce.KeyRecord
	for i := range recs {
		if recs[i].MerchantID == "m-crec" && recs[i].Key == "orphan" {
			found = &recs[i]
		}
	}
	if found == nil || found.Operation == nil || found.Operation.ID != p.Operation.ID || found.Kind() != chargeonce.KindCapture ||
		found.Charge.ID != ch.ID || found.Reference() != p.Operation.ID || found.Charge.CaptureMethod != chargeonce.CaptureManual {
		t.Fatalf("claimed records: %+v; want the capture's", recs)
	}
	if err := completeOperation(t, s, *found, found.Token, chargeonce.OperationSucceeded); err != nil {
		t.Fatal(err)
	}
	if got := chargeNow(t, s, ch); got.Status != chargeonce.StatusCaptured || got.CapturedCents != 40 {
		t.Fatalf("charge after recovery captured it: %+v", got)
	}
	c := newOperation(authorizedCharge(t, s, "m-crec", 100), chargeonce.KindCancel, "claim-me", 0)
	insertOperation(t, s, c)
	if err := s.KeyLeaseSet(t.Context(), "m-crec", "claim-me", c.Token, 0, true); err != nil {
		t.Fatal(err)
	}
	got, claimed, err := s.KeyClaim(t.Context(), "m-crec", "claim-me", "tok_new", longLease)
	if err != nil || !claimed || got.Operation == nil || got.Kind() != chargeonce.KindCancel || got.RecoveryAttempts != 1 {
		t.Fatalf("KeyClaim of a cancel's record: claimed=%v err=%v rec=%+v", claimed, err, got.Operation)
	}
}

// testOperationEventsOnce: an authorization records no event; its capture
// records charge.captured once, a cancel charge.canceled once, and a
// failed capture nothing.
func testOperationEventsOnce(t *testing.T, s chargeonce.Store) {
	types := func(ch chargeonce.Charge) map[string]int {
		t.Helper()
		page, err := s.WebhookEventsList(t.Context(), chargeonce.EventsListParams{MerchantID: ch.MerchantID, ChargeID: ch.ID, Limit: 100})
		if err != nil {
			t.Fatalf("WebhookEventsList: %v", err)
		}
		got := map[string]int{}
		for _, ev := range page.Events {
			got[ev.Type]++
		}
		return got
	}
	a := authorizedCharge(t, s, "m-oev", 100)
	if got := types(a); len(got) != 0 {
		t.Fatalf("events of an authorization: %v; want none", got)
	}
	f := newOperation(a, chargeonce.KindCapture, "fail", 0)
	frec := insertOperation(t, s, f)
	if err := completeOperation(t, s, frec, f.Token, chargeonce.OperationFailed); err != nil {
		t.Fatal(err)
	}
	if got := types(a); len(got) != 0 {
		t.Fatalf("events after a failed capture: %v; want none", got)
	}
	p := newOperation(a, chargeonce.KindCapture, "cap", 0)
	rec := insertOperation(t, s, p)
	if err := completeOperation(t, s, rec, p.Token, chargeonce.OperationSucceeded); err != nil {
		t.Fatal(err)
	}
	if got := types(a); got["charge.captured"] != 1 || len(got) != 1 {
		t.Fatalf("events after the capture: %v; want charge.captured once", got)
	}
	b := authorizedCharge(t, s, "m-oev", 100)
	c := newOperation(b, chargeonce.KindCancel, "cnl", 0)
	crec := insertOperation(t, s, c)
	if err := completeOperation(t, s, crec, c.Token, chargeonce.OperationSucceeded); err != nil {
		t.Fatal(err)
	}
	if got := types(b); got["charge.canceled"] != 1 || len(got) != 1 {
		t.Fatalf("events after the cancel: %v; want charge.canceled once", got)
	}
}

// testAuthorizationsExpired: authorizations older than the TTL are listed,
// in (created_at, id) order, after a cursor when given, until a cancel or
// capture holds them; automatic charges and young authorizations never
// are. One whose sweeper's cancel (chargeonce.ExpiryKeyPrefix) failed is
// listed no more; a merchant's own failed cancel does not hide it.
func testAuthorizationsExpired(t *testing.T, s chargeonce.Store) {
	capturedCharge(t, s, "m-aexp", 100)
	a := authorizedCharge(t, s, "m-aexp", 100)
	time.Sleep(3 * time.Millisecond) // SQLite's clock counts milliseconds
	b := authorizedCharge(t, s, "m-aexp", 100)
	time.Sleep(3 * time.Millisecond)
	c := authorizedCharge(t, s, "m-aexp", 100)
	young, err := s.AuthorizationsExpired(t.Context(), chargeonce.AuthorizationsExpiredParams{TTL: time.Hour, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range young {
		if e.MerchantID == "m-aexp" {
			t.Fatalf("an authorization a few milliseconds old expired under a TTL of an hour: %+v", e)
		}
	}
	time.Sleep(5 * time.Millisecond)
	page := func(after *chargeonce.ExpiredAuthorization) ([]string, []chargeonce.ExpiredAuthorization) {
		t.Helper()
		got, err := s.AuthorizationsExpired(t.Context(), chargeonce.AuthorizationsExpiredParams{TTL: time.Millisecond, Limit: 1000, After: after})
		if err != nil {
			t.Fatal(err)
		}
		var (
			ids  []string
			mine []chargeonce.ExpiredAuthorization
		)
		for _, e := range got {
			if e.MerchantID == "m-aexp" {
				ids = append(ids, e.ChargeID)
				mine = append(mine, e)
			}
		}
		return ids, mine
	}
	list := func() []string {
		t.Helper()
		ids, _ := page(nil)
		return ids
	}
	got, all := page(nil)
	if len(got) != 3 || got[0] != a.ID || got[1] != b.ID || got[2] != c.ID {
		t.Fatalf("expired authorizations: %v; want %s, %s, %s", got, a.ID, b.ID, c.ID)
	}
	if !all[0].CreatedAt.Equal(a.CreatedAt) {
		t.Fatalf("the listed authorization's created_at %v is not the charge's %v", all[0].CreatedAt, a.CreatedAt)
	}
	if after, _ := page(&all[0]); len(after) != 2 || after[0] != b.ID || after[1] != c.ID {
		t.Fatalf("expired authorizations after %s: %v; want %s, %s", a.ID, after, b.ID, c.ID)
	}
	if after, _ := page(&all[2]); len(after) != 0 {
		t.Fatalf("expired authorizations after the last one: %v; want none", after)
	}
	insertOperation(t, s, newOperation(a, chargeonce.KindCancel, "sweep-a", 0))
	if got := list(); len(got) != 2 || got[0] != b.ID || got[1] != c.ID {
		t.Fatalf("expired authorizations once a's cancel is pending: %v; want %s, %s", got, b.ID, c.ID)
	}
	// b's cancel by its merchant failed: still the sweeper's to try. c's
	// by the sweeper failed: an operator's, never listed again.
	for _, f := range []struct {
		ch  chargeonce.Charge
		key string
	}{{b, "merchant-cancel-b"}, {c, chargeonce.ExpiryKeyPrefix + c.ID}} {
		p := newOperation(f.ch, chargeonce.KindCancel, f.key, 0)
		rec := insertOperation(t, s, p)
		if err := completeOperation(t, s, rec, p.Token, chargeonce.OperationFailed); err != nil {
			t.Fatalf("failing the cancel %s: %v", f.key, err)
		}
	}
	if got := list(); len(got) != 1 || got[0] != b.ID {
		t.Fatalf("expired authorizations once b's merchant's cancel and c's sweeper's cancel failed: %v; want %s", got, b.ID)
	}
	if got, err := s.AuthorizationsExpired(t.Context(), chargeonce.AuthorizationsExpiredParams{TTL: time.Millisecond}); err != nil || len(got) != 0 {
		t.Fatalf("limit 0: %v, %v", got, err)
	}
}
