package storetest

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
)

// webhookTests are the settlement events' part of the suite: one event for
// every settlement, endpoints, and leased deliveries.
var webhookTests = []struct {
	name string
	fn   func(t *testing.T, s chargeonce.Store)
}{
	{"WebhookEventAndItsDelivery", testWebhookEventAndItsDelivery},
	{"WebhookEventForEverySettlement", testWebhookEventForEverySettlement},
	{"WebhookEventByRecovery", testWebhookEventByRecovery},
	{"WebhookEventOncePerSettlementRace", testWebhookEventOncePerSettlementRace},
	{"WebhookClaimConcurrentOnce", testWebhookClaimConcurrentOnce},
	{"WebhookClaimPerMerchant", testWebhookClaimPerMerchant},
	{"WebhookFinishRetryAndStale", testWebhookFinishRetryAndStale},
	{"WebhookDisable", testWebhookDisable},
	{"WebhookEndpointsCRUD", testWebhookEndpointsCRUD},
	{"WebhookEventsListAndRedeliver", testWebhookEventsListAndRedeliver},
	{"WebhookRedeliverOnePending", testWebhookRedeliverOnePending},
	{"WebhookClaimPastHeldBacklog", testWebhookClaimPastHeldBacklog},
	{"WebhookEndpointCapRace", testWebhookEndpointCapRace},
	{"WebhookAttemptsPaged", testWebhookAttemptsPaged},
	{"WebhookEndpointLifecycle", testWebhookEndpointLifecycle},
	{"WebhookFinishBatch", testWebhookFinishBatch},
	{"WebhookFinishBatchRace", testWebhookFinishBatchRace},
	{"WebhookClaimReadsCharge", testWebhookClaimReadsCharge},
	{"WebhookEndpointConcurrency", testWebhookEndpointConcurrency},
	{"WebhookDisablesRaceSenders", testWebhookDisablesRaceSenders},
	{"WebhookRecoverBounded", testWebhookRecoverBounded},
	{"WebhookRecoverEnabledEvents", testWebhookRecoverEnabledEvents},
}

func addEndpoint(t *testing.T, s chargeonce.Store, merchant string) chargeonce.WebhookEndpoint {
	t.Helper()
	e, err := s.WebhookEndpointCreate(t.Context(), chargeonce.WebhookEndpoint{
		ID: "we_" + randHex(8), MerchantID: merchant, URL: "https://example.com/hook",
		Description: "test", Secret: "whsec_" + randHex(16),
	})
	if err != nil {
		t.Fatalf("WebhookEndpointCreate: %v", err)
	}
	if e.Status != chargeonce.EndpointEnabled || e.CreatedAt.IsZero() || e.MerchantID != merchant {
		t.Fatalf("WebhookEndpointCreate returned %+v", e)
	}
	return e
}

func events(t *testing.T, s chargeonce.Store, merchant string) []chargeonce.WebhookEvent {
	t.Helper()
	page, err := s.WebhookEventsList(t.Context(), chargeonce.EventsListParams{MerchantID: merchant, Limit: chargeonce.EventsListMaxLimit})
	if err != nil {
		t.Fatalf("WebhookEventsList: %v", err)
	}
	return page.Events
}

func claimDeliveries(t *testing.T, s chargeonce.Store, lease time.Duration) []chargeonce.WebhookDelivery {
	t.Helper()
	ds, err := s.WebhookDeliveriesClaim(t.Context(), lease, 1000, 1000, nil)
	if err != nil {
		t.Fatalf("WebhookDeliveriesClaim: %v", err)
	}
	return ds
}

func settle(t *testing.T, s chargeonce.Store, merchant, key string) chargeonce.KeyInsertParams {
	t.Helper()
	p := newIntent(merchant, key)
	insert(t, s, p)
	complete(t, s, merchant, key, p.Token, []byte(`{}`))
	return p
}

// disabledEndpoint gives merchant an endpoint that a 410 has disabled, and
// returns the settlement whose delivery disabled it (key k-disabling): it
// has its event, and no delivery is left pending.
func disabledEndpoint(t *testing.T, s chargeonce.Store, merchant string) chargeonce.KeyInsertParams {
	t.Helper()
	e := addEndpoint(t, s, merchant)
	p := settle(t, s, merchant, "k-disabling")
	ds := claimDeliveries(t, s, longLease)
	if len(ds) != 1 || ds[0].Endpoint.ID != e.ID {
		t.Fatalf("claimed %+v, want the one delivery to %s", ds, e.ID)
	}
	disabled, err := s.WebhookDeliveryFinish(t.Context(), ds[0], chargeonce.WebhookOutcome{
		Attempt: chargeonce.WebhookAttempt{StatusCode: http.StatusGone}, Disable: "the endpoint answered 410 Gone"})
	if err != nil || !disabled {
		t.Fatalf("finish with 410: disabled=%v, %v", disabled, err)
	}
	return p
}

// wantEvents checks that merchant's events are exactly one per charge of
// want (charge id to event type), each with the id derived from its
// charge's, and that each is found by its charge id too.
func wantEvents(t *testing.T, s chargeonce.Store, merchant string, want map[string]string) {
	t.Helper()
	evs := events(t, s, merchant)
	got := map[string]int{}
	for _, ev := range evs {
		got[ev.ChargeID]++
		if typ, ok := want[ev.ChargeID]; !ok || ev.Type != typ || ev.MerchantID != merchant || ev.ID != "evt_"+ev.ChargeID[3:] || ev.CreatedAt.IsZero() {
			t.Fatalf("%s: event %+v; want %d events, of types %v", merchant, ev, len(want), want)
		}
	}
	for id := range want {
		if got[id] != 1 {
			t.Fatalf("%s: charge %s settled and has %d events, want 1 (%d events for %d settlements)", merchant, id, got[id], len(evs), len(want))
		}
		page, err := s.WebhookEventsList(t.Context(), chargeonce.EventsListParams{MerchantID: merchant, ChargeID: id, Limit: 10})
		if err != nil || len(page.Events) != 1 || page.Events[0].ChargeID != id {
			t.Fatalf("%s: events of charge %s = %+v, %v; want one", merchant, id, page.Events, err)
		}
	}
}

func testWebhookEventAndItsDelivery(t *testing.T, s chargeonce.Store) {
	before := settle(t, s, "m1", "k-before")
	e := addEndpoint(t, s, "m1")
	p := settle(t, s, "m1", "k-after")
	other := settle(t, s, "m2", "k-other") // another merchant, no endpoint

	wantEvents(t, s, "m1", map[string]string{before.Charge.ID: chargeonce.EventChargeCaptured, p.Charge.ID: chargeonce.EventChargeCaptured})
	// A stale second completion writes nothing more.
	err := s.KeyComplete(t.Context(), chargeonce.KeyCompleteParams{MerchantID: "m1", Key: "k-after", Token: p.Token,
		ChargeStatus: chargeonce.StatusDeclined, ResponseStatus: 402, ResponseBody: []byte(`{}`), TTL: longTTL})
	wantCode(t, "second KeyComplete", err, chargeonce.ESTALE)
	wantEvents(t, s, "m1", map[string]string{before.Charge.ID: chargeonce.EventChargeCaptured, p.Charge.ID: chargeonce.EventChargeCaptured})
	wantEvents(t, s, "m2", map[string]string{other.Charge.ID: chargeonce.EventChargeCaptured})
	// Deliveries go to the endpoints enabled when the event is recorded:
	// the event of the charge settled before m1 had one is not delivered.
	ds := claimDeliveries(t, s, longLease)
	if len(ds) != 1 || ds[0].Event.ChargeID != p.Charge.ID || ds[0].Endpoint.ID != e.ID || ds[0].Endpoint.Secret != e.Secret || ds[0].Attempts != 0 {
		t.Fatalf("claimed %+v, want one delivery of %s's event to %s", ds, p.Charge.ID, e.ID)
	}
	st, err := s.WebhookStats(t.Context())
	if err != nil || st.Pending != 1 || st.OldestPendingAge < 0 || st.OldestPendingAge > time.Minute {
		t.Fatalf("WebhookStats = %+v, %v; want 1 pending", st, err)
	}
}

// testWebhookEventForEverySettlement settles charges of a merchant with no
// endpoint and of one whose only endpoint is disabled, in each way a
// settlement reaches a store (an attempt's completion, completions at once,
// which a store may batch, recovery's completion after its claim): each
// records exactly one event of its outcome, which the events list shows,
// and no delivery, since no endpoint is enabled. Events are the log,
// whoever reads them later (issue 32: a charge settled by recovery while
// its merchant's only endpoint was disabled had no event at all).
func testWebhookEventForEverySettlement(t *testing.T, s chargeonce.Store) {
	disabling := disabledEndpoint(t, s, "m-disabled")
	for _, merchant := range []string{"m-disabled", "m-none"} {
		want := map[string]string{}
		if merchant == "m-disabled" {
			want[disabling.Charge.ID] = chargeonce.EventChargeCaptured
		}
		// An attempt's own completion, captured and declined.
		p := settle(t, s, merchant, "k-attempt")
		want[p.Charge.ID] = chargeonce.EventChargeCaptured
		p = newIntent(merchant, "k-declined")
		insert(t, s, p)
		if err := s.KeyComplete(t.Context(), chargeonce.KeyCompleteParams{MerchantID: merchant, Key: "k-declined", Token: p.Token,
			ChargeStatus: chargeonce.StatusDeclined, DeclineCode: "insufficient_funds", ResponseStatus: 402, ResponseBody: []byte(`{}`), TTL: longTTL}); err != nil {
			t.Fatalf("KeyComplete declined: %v", err)
		}
		want[p.Charge.ID] = chargeonce.EventChargeDeclined

		// Completions at once.
		const n = 16
		ps := make([]chargeonce.KeyInsertParams, n)
		for i := range ps {
			ps[i] = newIntent(merchant, fmt.Sprintf("k-together-%02d", i))
			insert(t, s, ps[i])
			want[ps[i].Charge.ID] = chargeonce.EventChargeCaptured
		}
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i, p := range ps {
			wg.Go(func() {
				errs[i] = s.KeyComplete(t.Context(), chargeonce.KeyCompleteParams{MerchantID: merchant, Key: p.Charge.IdempotencyKey, Token: p.Token,
					ChargeStatus: chargeonce.StatusCaptured, ResponseStatus: 201, ResponseBody: []byte(`{}`), TTL: longTTL})
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("KeyComplete(%s) at once with others: %v", ps[i].Charge.IdempotencyKey, err)
			}
		}

		// Recovery: an orphaned record, claimed, then completed under the
		// claim's token; the first attempt's late completion is stale.
		p = newIntent(merchant, "k-recovered")
		p.Lease = 0
		insert(t, s, p)
		recs, err := s.KeysClaimExpired(t.Context(), longLease, 10)
		if err != nil || len(recs) != 1 || recs[0].Charge.ID != p.Charge.ID {
			t.Fatalf("KeysClaimExpired = %+v, %v; want the orphaned record", recs, err)
		}
		if err := s.KeyComplete(t.Context(), chargeonce.KeyCompleteParams{MerchantID: merchant, Key: "k-recovered", Token: recs[0].Token,
			ChargeStatus: chargeonce.StatusCaptured, ResponseStatus: 201, ResponseBody: []byte(`{}`), TTL: longTTL}); err != nil {
			t.Fatalf("recovery's KeyComplete: %v", err)
		}
		err = s.KeyComplete(t.Context(), chargeonce.KeyCompleteParams{MerchantID: merchant, Key: "k-recovered", Token: p.Token,
			ChargeStatus: chargeonce.StatusDeclined, ResponseStatus: 402, ResponseBody: []byte(`{}`), TTL: longTTL})
		wantCode(t, "the first attempt's late KeyComplete", err, chargeonce.ESTALE)
		want[p.Charge.ID] = chargeonce.EventChargeCaptured

		// A processing charge has no event yet.
		insert(t, s, newIntent(merchant, "k-processing"))

		wantEvents(t, s, merchant, want)
	}
	if ds := claimDeliveries(t, s, longLease); len(ds) != 0 {
		t.Fatalf("claimed %d deliveries (first %+v); want none: no endpoint is enabled", len(ds), ds[0])
	}
	if st, err := s.WebhookStats(t.Context()); err != nil || st.Pending != 0 || st.EndpointsDisabled != 1 {
		t.Fatalf("WebhookStats = %+v, %v; want nothing pending and one endpoint disabled", st, err)
	}
}

func testWebhookEventByRecovery(t *testing.T, s chargeonce.Store) {
	addEndpoint(t, s, "m1")
	p := newIntent("m1", "k1")
	p.Lease = 0
	insert(t, s, p)
	recs, err := s.KeysClaimExpired(t.Context(), longLease, 10)
	if err != nil || len(recs) != 1 {
		t.Fatalf("KeysClaimExpired = %d, %v", len(recs), err)
	}
	err = s.KeyComplete(t.Context(), chargeonce.KeyCompleteParams{MerchantID: "m1", Key: "k1", Token: recs[0].Token,
		ChargeStatus: chargeonce.StatusDeclined, DeclineCode: "insufficient_funds", ResponseStatus: 402, ResponseBody: []byte(`{}`), TTL: longTTL})
	if err != nil {
		t.Fatalf("recovery's KeyComplete: %v", err)
	}
	evs := events(t, s, "m1")
	if len(evs) != 1 || evs[0].Type != chargeonce.EventChargeDeclined || evs[0].ChargeID != p.Charge.ID {
		t.Fatalf("events after recovery settled: %+v", evs)
	}
}

// testWebhookEventOncePerSettlementRace settles many charges at once, each
// raced by its first attempt and a recovery claim, and finds exactly one
// event per charge and one delivery per event and endpoint.
func testWebhookEventOncePerSettlementRace(t *testing.T, s chargeonce.Store) {
	addEndpoint(t, s, "m1")
	addEndpoint(t, s, "m1")
	const n = 40
	ps := make([]chargeonce.KeyInsertParams, n)
	for i := range ps {
		ps[i] = newIntent("m1", fmt.Sprintf("k%02d", i))
		ps[i].Lease = 0
		insert(t, s, ps[i])
	}
	claimed := map[string]string{}
	recs, err := s.KeysClaimExpired(t.Context(), longLease, n)
	if err != nil || len(recs) != n {
		t.Fatalf("KeysClaimExpired = %d, %v", len(recs), err)
	}
	for _, r := range recs {
		claimed[r.Key] = r.Token
	}
	var wg sync.WaitGroup
	for _, p := range ps {
		for _, tok := range []string{p.Token, claimed[p.Charge.IdempotencyKey]} {
			wg.Go(func() {
				_ = s.KeyComplete(t.Context(), chargeonce.KeyCompleteParams{MerchantID: "m1", Key: p.Charge.IdempotencyKey, Token: tok,
					ChargeStatus: chargeonce.StatusCaptured, ResponseStatus: 201, ResponseBody: []byte(`{}`), TTL: longTTL})
			})
		}
	}
	wg.Wait()
	evs := events(t, s, "m1")
	seen := map[string]bool{}
	for _, ev := range evs {
		if seen[ev.ChargeID] {
			t.Fatalf("two events for charge %s", ev.ChargeID)
		}
		seen[ev.ChargeID] = true
	}
	if len(evs) != n {
		t.Fatalf("got %d events for %d settled charges", len(evs), n)
	}
	if ds := claimDeliveries(t, s, longLease); len(ds) != 2*n {
		t.Fatalf("got %d deliveries, want %d (2 endpoints x %d events)", len(ds), 2*n, n)
	}
}

func testWebhookClaimConcurrentOnce(t *testing.T, s chargeonce.Store) {
	addEndpoint(t, s, "m1")
	const n = 30
	for i := range n {
		settle(t, s, "m1", fmt.Sprintf("k%02d", i))
	}
	var (
		mu  sync.Mutex
		got = map[int64]int{}
		wg  sync.WaitGroup
	)
	for range 8 {
		wg.Go(func() {
			for range 10 {
				ds, err := s.WebhookDeliveriesClaim(t.Context(), longLease, 3, 100, nil)
				if err != nil {
					t.Errorf("WebhookDeliveriesClaim: %v", err)
					return
				}
				mu.Lock()
				for _, d := range ds {
					got[d.ID]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(got) != n {
		t.Fatalf("claimed %d distinct deliveries, want %d", len(got), n)
	}
	for id, c := range got {
		if c != 1 {
			t.Fatalf("delivery %d claimed %d times while its lease ran", id, c)
		}
	}
}

func testWebhookClaimPerMerchant(t *testing.T, s chargeonce.Store) {
	addEndpoint(t, s, "busy")
	addEndpoint(t, s, "calm")
	for i := range 10 {
		settle(t, s, "busy", fmt.Sprintf("k%02d", i))
	}
	settle(t, s, "calm", "k")
	ds, err := s.WebhookDeliveriesClaim(t.Context(), longLease, 100, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	per := map[string]int{}
	for _, d := range ds {
		per[d.Event.MerchantID]++
	}
	if per["busy"] != 2 || per["calm"] != 1 {
		t.Fatalf("claimed per merchant %v, want busy:2 calm:1", per)
	}
	ds, err = s.WebhookDeliveriesClaim(t.Context(), longLease, 100, 100, []string{"busy"})
	if err != nil || len(ds) != 0 {
		t.Fatalf("claim skipping busy: %d deliveries, %v", len(ds), err)
	}
	if ds := claimDeliveries(t, s, longLease); len(ds) != 8 {
		t.Fatalf("then claimed %d, want the 8 left", len(ds))
	}
}

func testWebhookFinishRetryAndStale(t *testing.T, s chargeonce.Store) {
	addEndpoint(t, s, "m1")
	settle(t, s, "m1", "k1")
	ds := claimDeliveries(t, s, 50*time.Millisecond)
	if len(ds) != 1 {
		t.Fatalf("claimed %d", len(ds))
	}
	d := ds[0]
	// The claim ends; another sender takes it; the first one's finish is stale.
	time.Sleep(100 * time.Millisecond)
	ds2 := claimDeliveries(t, s, longLease)
	if len(ds2) != 1 || ds2[0].Token == d.Token {
		t.Fatalf("re-claim after the lease: %+v", ds2)
	}
	_, err := s.WebhookDeliveryFinish(t.Context(), d, chargeonce.WebhookOutcome{
		Attempt: chargeonce.WebhookAttempt{StatusCode: 200, Latency: time.Millisecond}, Delivered: true})
	wantCode(t, "finish under a lost claim", err, chargeonce.ESTALE)

	d = ds2[0]
	if _, err := s.WebhookDeliveryFinish(t.Context(), d, chargeonce.WebhookOutcome{
		Attempt: chargeonce.WebhookAttempt{StatusCode: 500, Latency: 2 * time.Millisecond}, RetryIn: time.Hour}); err != nil {
		t.Fatalf("finish with a retry: %v", err)
	}
	if ds := claimDeliveries(t, s, longLease); len(ds) != 0 {
		t.Fatalf("a delivery due in an hour was claimed now: %+v", ds)
	}
	_, attempts, err := s.WebhookEventGet(t.Context(), "m1", d.Event.ID)
	if err != nil || len(attempts) != 2 || attempts[0].StatusCode != http.StatusOK || attempts[1].StatusCode != http.StatusInternalServerError ||
		attempts[1].Latency != 2*time.Millisecond || attempts[1].EndpointID != d.Endpoint.ID {
		t.Fatalf("WebhookEventGet attempts = %+v, %v", attempts, err)
	}
	if _, _, err := s.WebhookEventGet(t.Context(), "m2", d.Event.ID); chargeonce.ErrorCode(err) != chargeonce.ENOTFOUND {
		t.Fatalf("another merchant's event: %v", err)
	}
}

func testWebhookDisable(t *testing.T, s chargeonce.Store) {
	addEndpoint(t, s, "m1")
	settle(t, s, "m1", "k1")
	settle(t, s, "m1", "k2")
	ds := claimDeliveries(t, s, longLease)
	if len(ds) != 2 {
		t.Fatalf("claimed %d", len(ds))
	}
	disabled, err := s.WebhookDeliveryFinish(t.Context(), ds[0], chargeonce.WebhookOutcome{
		Attempt: chargeonce.WebhookAttempt{StatusCode: 410}, Disable: "the endpoint answered 410 Gone"})
	if err != nil || !disabled {
		t.Fatalf("finish with 410: disabled=%v, %v", disabled, err)
	}
	eps, err := s.WebhookEndpointsList(t.Context(), "m1")
	if err != nil || len(eps) != 1 || eps[0].Status != chargeonce.EndpointDisabled || eps[0].DisabledReason == "" {
		t.Fatalf("endpoints after 410: %+v, %v", eps, err)
	}
	st, err := s.WebhookStats(t.Context())
	if err != nil || st.EndpointsDisabled != 1 || st.Pending != 0 { // disabling ended ds[1] too
		t.Fatalf("WebhookStats = %+v, %v", st, err)
	}
	// A settlement now records its event, and no delivery: the merchant
	// has no enabled endpoint.
	settle(t, s, "m1", "k3")
	if evs := events(t, s, "m1"); len(evs) != 3 {
		t.Fatalf("events = %d, want 3", len(evs))
	}
	if ds := claimDeliveries(t, s, longLease); len(ds) != 0 {
		t.Fatalf("claimed %+v for a merchant whose endpoint is disabled", ds)
	}

	// Three days of failure, scaled down: the second failure past the
	// window disables the endpoint.
	slow := addEndpoint(t, s, "m2")
	settle(t, s, "m2", "k1")
	fail := func() bool {
		ds := claimDeliveries(t, s, longLease)
		if len(ds) != 1 || ds[0].Endpoint.ID != slow.ID {
			t.Fatalf("claimed %+v", ds)
		}
		disabled, err := s.WebhookDeliveryFinish(t.Context(), ds[0], chargeonce.WebhookOutcome{
			Attempt: chargeonce.WebhookAttempt{Error: "connection refused"}, RetryIn: time.Microsecond, DisableAfter: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return disabled
	}
	if fail() {
		t.Fatal("the first failure disabled the endpoint")
	}
	time.Sleep(50 * time.Millisecond)
	if !fail() {
		t.Fatal("a failure past DisableAfter did not disable the endpoint")
	}
}

func testWebhookEndpointsCRUD(t *testing.T, s chargeonce.Store) {
	a := addEndpoint(t, s, "m1")
	b := addEndpoint(t, s, "m1")
	eps, err := s.WebhookEndpointsList(t.Context(), "m1")
	if err != nil || len(eps) != 2 || eps[0].ID != a.ID || eps[1].ID != b.ID {
		t.Fatalf("list = %+v, %v", eps, err)
	}
	if eps, _ := s.WebhookEndpointsList(t.Context(), "m2"); len(eps) != 0 {
		t.Fatalf("m2 sees %d endpoints", len(eps))
	}
	r, err := s.WebhookEndpointRotate(t.Context(), "m1", a.ID, "whsec_new", time.Hour)
	if err != nil || r.Secret != "whsec_new" || r.OldSecret != a.Secret {
		t.Fatalf("rotate = %+v, %v", r, err)
	}
	if got := r.Secrets(time.Now()); len(got) != 2 || got[0] != "whsec_new" || got[1] != a.Secret {
		t.Fatalf("Secrets during the overlap = %v", got)
	}
	if got := r.Secrets(r.OldSecretUntil.Add(time.Second)); len(got) != 1 {
		t.Fatalf("Secrets after the overlap = %v", got)
	}
	_, err = s.WebhookEndpointRotate(t.Context(), "m2", a.ID, "whsec_x", time.Hour)
	wantCode(t, "rotate another merchant's endpoint", err, chargeonce.ENOTFOUND)
	wantCode(t, "delete another merchant's endpoint", s.WebhookEndpointDelete(t.Context(), "m2", a.ID), chargeonce.ENOTFOUND)

	settle(t, s, "m1", "k1")
	if err := s.WebhookEndpointDelete(t.Context(), "m1", a.ID); err != nil {
		t.Fatalf("delete: %v", err)
	}
	wantCode(t, "delete again", s.WebhookEndpointDelete(t.Context(), "m1", a.ID), chargeonce.ENOTFOUND)
	ds := claimDeliveries(t, s, longLease)
	if len(ds) != 1 || ds[0].Endpoint.ID != b.ID {
		t.Fatalf("deliveries after deleting %s: %+v", a.ID, ds)
	}
}

func testWebhookEventsListAndRedeliver(t *testing.T, s chargeonce.Store) {
	addEndpoint(t, s, "m1")
	var ids []string
	for i := range 5 {
		p := settle(t, s, "m1", fmt.Sprintf("k%d", i))
		ids = append(ids, p.Charge.ID)
	}
	first, err := s.WebhookEventsList(t.Context(), chargeonce.EventsListParams{MerchantID: "m1", Limit: 3})
	if err != nil || len(first.Events) != 3 || !first.HasMore {
		t.Fatalf("first page: %+v, %v", first, err)
	}
	second, err := s.WebhookEventsList(t.Context(), chargeonce.EventsListParams{MerchantID: "m1", Limit: 3, StartingAfter: first.Events[2].ID})
	if err != nil || len(second.Events) != 2 || second.HasMore {
		t.Fatalf("second page: %+v, %v", second, err)
	}
	seen := map[string]bool{}
	for _, ev := range append(first.Events, second.Events...) {
		seen[ev.ChargeID] = true
	}
	if len(seen) != 5 {
		t.Fatalf("pages cover %d charges, want 5", len(seen))
	}
	one, err := s.WebhookEventsList(t.Context(), chargeonce.EventsListParams{MerchantID: "m1", Limit: 10, ChargeID: ids[2]})
	if err != nil || len(one.Events) != 1 || one.Events[0].ChargeID != ids[2] {
		t.Fatalf("by charge: %+v, %v", one, err)
	}
	_, err = s.WebhookEventsList(t.Context(), chargeonce.EventsListParams{MerchantID: "m2", Limit: 10, StartingAfter: first.Events[0].ID})
	wantCode(t, "another merchant's cursor", err, chargeonce.EINVALID)

	ds := claimDeliveries(t, s, longLease)
	if len(ds) != 5 {
		t.Fatalf("claimed %d", len(ds))
	}
	for _, d := range ds {
		if _, err := s.WebhookDeliveryFinish(t.Context(), d, chargeonce.WebhookOutcome{
			Attempt: chargeonce.WebhookAttempt{StatusCode: 200}, Delivered: true}); err != nil {
			t.Fatal(err)
		}
	}
	n, err := s.WebhookEventRedeliver(t.Context(), "m1", one.Events[0].ID)
	if err != nil || n != 1 {
		t.Fatalf("redeliver = %d, %v", n, err)
	}
	ds = claimDeliveries(t, s, longLease)
	if len(ds) != 1 || ds[0].Event.ID != one.Events[0].ID {
		t.Fatalf("after redeliver claimed %+v", ds)
	}
	_, err = s.WebhookEventRedeliver(t.Context(), "m2", one.Events[0].ID)
	wantCode(t, "redeliver another merchant's event", err, chargeonce.ENOTFOUND)
}

// testWebhookRedeliverOnePending: an event is owed at most once to each
// endpoint, however many redeliveries race; a redelivery of a delivery
// waiting for its next try makes it due now.
func testWebhookRedeliverOnePending(t *testing.T, s chargeonce.Store) {
	addEndpoint(t, s, "m1")
	addEndpoint(t, s, "m1")
	settle(t, s, "m1", "k1")
	ev := events(t, s, "m1")[0]
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for range 50 {
		wg.Go(func() {
			if n, err := s.WebhookEventRedeliver(t.Context(), "m1", ev.ID); err != nil || n != 2 {
				errs <- fmt.Errorf("redeliver = %d, %w; want 2 (one per endpoint)", n, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if st, err := s.WebhookStats(t.Context()); err != nil || st.Pending != 2 {
		t.Fatalf("after 50 redeliveries: %d pending, %v; want 2, one per endpoint", st.Pending, err)
	}
	ds := claimDeliveries(t, s, longLease)
	if len(ds) != 2 {
		t.Fatalf("claimed %d, want 2", len(ds))
	}
	// One waits an hour for its next try; a redelivery makes it due now.
	if _, err := s.WebhookDeliveryFinish(t.Context(), ds[0], chargeonce.WebhookOutcome{
		Attempt: chargeonce.WebhookAttempt{StatusCode: 500}, RetryIn: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.WebhookDeliveryFinish(t.Context(), ds[1], chargeonce.WebhookOutcome{
		Attempt: chargeonce.WebhookAttempt{StatusCode: 200}, Delivered: true}); err != nil {
		t.Fatal(err)
	}
	if n, err := s.WebhookEventRedeliver(t.Context(), "m1", ev.ID); err != nil || n != 2 {
		t.Fatalf("redeliver = %d, %v; want 2", n, err)
	}
	ds = claimDeliveries(t, s, longLease)
	if len(ds) != 2 || ds[0].Endpoint.ID == ds[1].Endpoint.ID {
		t.Fatalf("claimed %+v after the redelivery; want one delivery per endpoint, due now", ds)
	}
	if st, err := s.WebhookStats(t.Context()); err != nil || st.Pending != 2 {
		t.Fatalf("%d pending, %v; want 2", st.Pending, err)
	}
}

// testWebhookClaimPastHeldBacklog: a merchant held at its limit (skipped)
// with a long backlog, and one whose deliveries are mostly claimed, do not
// keep another merchant's due delivery from the claim.
func testWebhookClaimPastHeldBacklog(t *testing.T, s chargeonce.Store) {
	addEndpoint(t, s, "busy")
	addEndpoint(t, s, "calm")
	for i := range 30 {
		settle(t, s, "busy", fmt.Sprintf("k%02d", i))
	}
	settle(t, s, "calm", "k")
	ds, err := s.WebhookDeliveriesClaim(t.Context(), longLease, 1, 4, []string{"busy"})
	if err != nil || len(ds) != 1 || ds[0].Event.MerchantID != "calm" {
		t.Fatalf("claim of 1 skipping busy = %+v, %v; want calm's delivery", ds, err)
	}
	ds, err = s.WebhookDeliveriesClaim(t.Context(), longLease, 100, 4, nil)
	if err != nil || len(ds) != 4 {
		t.Fatalf("claim = %d, %v; want busy's first 4", len(ds), err)
	}
	ds, err = s.WebhookDeliveriesClaim(t.Context(), longLease, 100, 4, nil)
	if err != nil || len(ds) != 4 {
		t.Fatalf("claim past busy's 4 claimed = %d, %v; want its next 4", len(ds), err)
	}
}

// testWebhookEndpointCapRace: 64 concurrent creates for one merchant make
// exactly MaxWebhookEndpoints endpoints; the others are EINVALID, and
// another merchant is not counted against it. Seen before the stores
// enforced the cap: 35 endpoints against a cap of 16.
func testWebhookEndpointCapRace(t *testing.T, s chargeonce.Store) {
	addEndpoint(t, s, "other")
	var (
		wg              sync.WaitGroup
		mu              sync.Mutex
		created, capped int
	)
	for range 64 {
		wg.Go(func() {
			_, err := s.WebhookEndpointCreate(t.Context(), chargeonce.WebhookEndpoint{
				ID: "we_" + randHex(8), MerchantID: "m1", URL: "https://example.com/hook", Secret: "whsec_" + randHex(16),
			})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				created++
			case chargeonce.ErrorCode(err) == chargeonce.EINVALID:
				capped++
			default:
				t.Errorf("create: %v", err)
			}
		})
	}
	wg.Wait()
	eps, err := s.WebhookEndpointsList(t.Context(), "m1")
	if err != nil || created != chargeonce.MaxWebhookEndpoints || capped != 64-created || len(eps) != chargeonce.MaxWebhookEndpoints {
		t.Fatalf("64 concurrent creates: %d created, %d refused, %d listed (%v); want %d created", created, capped, len(eps), err, chargeonce.MaxWebhookEndpoints)
	}
	// Deleting one makes room for one.
	if err := s.WebhookEndpointDelete(t.Context(), "m1", eps[0].ID); err != nil {
		t.Fatal(err)
	}
	addEndpoint(t, s, "m1")
}

// testWebhookAttemptsPaged: an event with 30 attempts shows its 20 most
// recent with it (EventAttemptsEmbedded), and pages of its attempts, newest
// first, cover the 30 once each; another merchant reads none.
func testWebhookAttemptsPaged(t *testing.T, s chargeonce.Store) {
	addEndpoint(t, s, "m1")
	settle(t, s, "m1", "k1")
	const n = 30
	for i := range n {
		ds := claimDeliveries(t, s, longLease)
		if len(ds) != 1 {
			t.Fatalf("attempt %d: claimed %d", i, len(ds))
		}
		if _, err := s.WebhookDeliveryFinish(t.Context(), ds[0], chargeonce.WebhookOutcome{
			Attempt: chargeonce.WebhookAttempt{StatusCode: 500 + i, Latency: time.Millisecond}, RetryIn: time.Microsecond}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
	ev := events(t, s, "m1")[0]
	_, embedded, err := s.WebhookEventGet(t.Context(), "m1", ev.ID)
	if err != nil || len(embedded) != chargeonce.EventAttemptsEmbedded {
		t.Fatalf("WebhookEventGet: %d attempts, %v; want the %d most recent", len(embedded), err, chargeonce.EventAttemptsEmbedded)
	}
	if embedded[0].StatusCode != 500+n-chargeonce.EventAttemptsEmbedded || embedded[len(embedded)-1].StatusCode != 500+n-1 {
		t.Fatalf("embedded attempts %d..%d, want the most recent, oldest first", embedded[0].StatusCode, embedded[len(embedded)-1].StatusCode)
	}
	var (
		seen   []int
		cursor int64
	)
	for page := 0; ; page++ {
		p, err := s.WebhookAttemptsList(t.Context(), chargeonce.AttemptsListParams{MerchantID: "m1", EventID: ev.ID, Limit: 7, StartingAfter: cursor})
		if err != nil || len(p.Attempts) == 0 || len(p.Attempts) > 7 || page > 5 {
			t.Fatalf("page %d: %+v, %v", page, p, err)
		}
		for _, a := range p.Attempts {
			seen = append(seen, a.StatusCode)
			if a.ID == 0 || a.EventID != ev.ID {
				t.Fatalf("attempt %+v", a)
			}
		}
		cursor = p.Attempts[len(p.Attempts)-1].ID
		if !p.HasMore {
			break
		}
	}
	if len(seen) != n {
		t.Fatalf("pages cover %d attempts, want %d: %v", len(seen), n, seen)
	}
	for i, code := range seen {
		if code != 500+n-1-i {
			t.Fatalf("pages in order %v, want newest first", seen)
		}
	}
	_, err = s.WebhookAttemptsList(t.Context(), chargeonce.AttemptsListParams{MerchantID: "m2", EventID: ev.ID, Limit: 10})
	wantCode(t, "another merchant's attempts", err, chargeonce.ENOTFOUND)
	_, err = s.WebhookAttemptsList(t.Context(), chargeonce.AttemptsListParams{MerchantID: "m1", EventID: ev.ID, Limit: 101})
	wantCode(t, "limit 101", err, chargeonce.EINVALID)
}

// testWebhookEndpointLifecycle: enabled_events filters the fan-out and
// redelivery; disabling ends the pending deliveries; enabling again
// delivers new settlements; "recover failed since T" queues each failed
// event once, and not one delivered since.
func testWebhookEndpointLifecycle(t *testing.T, s chargeonce.Store) {
	ctx := t.Context()
	e, err := s.WebhookEndpointCreate(ctx, chargeonce.WebhookEndpoint{ID: "we_" + randHex(8), MerchantID: "m1",
		URL: "https://example.com/hook", Secret: "whsec_x", EnabledEvents: []string{chargeonce.EventChargeDeclined}})
	if err != nil || len(e.EnabledEvents) != 1 {
		t.Fatalf("create with enabled_events: %+v, %v", e, err)
	}
	settle(t, s, "m1", "k-captured") // captured: not for this endpoint
	p := newIntent("m1", "k-declined")
	insert(t, s, p)
	if err := s.KeyComplete(ctx, chargeonce.KeyCompleteParams{MerchantID: "m1", Key: "k-declined", Token: p.Token,
		ChargeStatus: chargeonce.StatusDeclined, DeclineCode: "card_declined", ResponseStatus: 402, ResponseBody: []byte(`{}`), TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	ds := claimDeliveries(t, s, longLease)
	if len(ds) != 1 || ds[0].Event.Type != chargeonce.EventChargeDeclined || len(ds[0].Endpoint.EnabledEvents) != 1 {
		t.Fatalf("claimed %+v; want the declined event only", ds)
	}
	for _, ev := range events(t, s, "m1") {
		if ev.Type == chargeonce.EventChargeCaptured {
			if n, err := s.WebhookEventRedeliver(ctx, "m1", ev.ID); err != nil || n != 0 {
				t.Fatalf("redeliver a captured event to an endpoint of declined ones: %d, %v", n, err)
			}
		}
	}
	// Every type again; a failed delivery, then the endpoint disabled.
	all := []string{}
	e, err = s.WebhookEndpointUpdate(ctx, "m1", e.ID, chargeonce.WebhookEndpointUpdate{EnabledEvents: &all})
	if err != nil || e.EnabledEvents != nil {
		t.Fatalf("enable every type: %+v, %v", e, err)
	}
	if _, err := s.WebhookDeliveryFinish(ctx, ds[0], chargeonce.WebhookOutcome{
		Attempt: chargeonce.WebhookAttempt{StatusCode: 500}, RetryIn: time.Hour}); err != nil {
		t.Fatal(err)
	}
	since := time.Now().Add(-time.Hour)
	settle(t, s, "m1", "k2")
	yes, no := true, false
	if e, err = s.WebhookEndpointUpdate(ctx, "m1", e.ID, chargeonce.WebhookEndpointUpdate{Disabled: &yes}); err != nil ||
		e.Status != chargeonce.EndpointDisabled || e.DisabledReason == "" {
		t.Fatalf("disable: %+v, %v", e, err)
	}
	if st, _ := s.WebhookStats(ctx); st.Pending != 0 {
		t.Fatalf("%d pending after disabling, want 0", st.Pending)
	}
	_, err = recoverFailed(ctx, s, "m1", e.ID, since)
	wantCode(t, "recover to a disabled endpoint", err, chargeonce.EINVALID)
	if e, err = s.WebhookEndpointUpdate(ctx, "m1", e.ID, chargeonce.WebhookEndpointUpdate{Disabled: &no}); err != nil ||
		e.Status != chargeonce.EndpointEnabled || e.DisabledReason != "" {
		t.Fatalf("enable again: %+v, %v", e, err)
	}
	_, err = s.WebhookEndpointUpdate(ctx, "m2", e.ID, chargeonce.WebhookEndpointUpdate{Disabled: &no})
	wantCode(t, "update another merchant's endpoint", err, chargeonce.ENOTFOUND)
	_, err = recoverFailed(ctx, s, "m2", e.ID, since)
	wantCode(t, "recover another merchant's endpoint", err, chargeonce.ENOTFOUND)

	// The two failed events (declined, k2) come back once each.
	n, err := recoverFailed(ctx, s, "m1", e.ID, since)
	if err != nil || n != 2 {
		t.Fatalf("recover = %d, %v; want the 2 failed events", n, err)
	}
	if n, err := recoverFailed(ctx, s, "m1", e.ID, since); err != nil || n != 0 {
		t.Fatalf("recover again = %d, %v; want 0: both are owed already", n, err)
	}
	if n, err := recoverFailed(ctx, s, "m1", e.ID, time.Now().Add(time.Hour)); err != nil || n != 0 {
		t.Fatalf("recover since the future = %d, %v", n, err)
	}
	ds = claimDeliveries(t, s, longLease)
	if len(ds) != 2 {
		t.Fatalf("claimed %d after recovery, want 2", len(ds))
	}
	for _, d := range ds {
		if _, err := s.WebhookDeliveryFinish(ctx, d, chargeonce.WebhookOutcome{Attempt: chargeonce.WebhookAttempt{StatusCode: 200}, Delivered: true}); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := recoverFailed(ctx, s, "m1", e.ID, since); err != nil || n != 0 {
		t.Fatalf("recover after both were delivered = %d, %v; want 0", n, err)
	}
	settle(t, s, "m1", "k3")
	if ds := claimDeliveries(t, s, longLease); len(ds) != 1 {
		t.Fatalf("a settlement after enabling again: %d deliveries, want 1", len(ds))
	}
}
