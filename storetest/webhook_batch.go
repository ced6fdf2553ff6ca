package storetest

import (
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
)

// testWebhookFinishBatch: WebhookDeliveriesFinish records a batch of mixed
// outcomes as WebhookDeliveryFinish would each: the delivered ones end
// (their attempts recorded, their endpoint's failure clock stopped), a
// failed one waits for its retry, one whose claim was lost is ESTALE with
// its attempt still recorded.
func testWebhookFinishBatch(t *testing.T, s chargeonce.Store) {
	e1, e2 := addEndpoint(t, s, "m1"), addEndpoint(t, s, "m1")
	for i := range 3 {
		settle(t, s, "m1", fmt.Sprintf("k%d", i))
	}
	ds := claimDeliveries(t, s, longLease)
	if len(ds) != 6 {
		t.Fatalf("claimed %d deliveries, want 6 (3 events to 2 endpoints)", len(ds))
	}
	// e2 fails once first, so that its failure clock runs.
	var fs []chargeonce.WebhookFinish
	var failed, stale chargeonce.WebhookDelivery
	for _, d := range ds {
		switch {
		case failed.ID == 0 && d.Endpoint.ID == e2.ID:
			failed = d
			fs = append(fs, chargeonce.WebhookFinish{Delivery: d, Outcome: chargeonce.WebhookOutcome{
				Attempt: chargeonce.WebhookAttempt{StatusCode: 500, Latency: time.Millisecond}, RetryIn: time.Hour, DisableAfter: time.Hour}})
		case stale.ID == 0 && d.Endpoint.ID == e1.ID:
			stale = d
			d.Token = "not-the-claim"
			fs = append(fs, chargeonce.WebhookFinish{Delivery: d, Outcome: chargeonce.WebhookOutcome{
				Attempt: chargeonce.WebhookAttempt{StatusCode: 200, Latency: time.Millisecond}, Delivered: true}})
		default:
			fs = append(fs, chargeonce.WebhookFinish{Delivery: d, Outcome: chargeonce.WebhookOutcome{
				Attempt: chargeonce.WebhookAttempt{StatusCode: 204, Latency: 3 * time.Millisecond}, Delivered: true}})
		}
	}
	s.WebhookDeliveriesFinish(t.Context(), fs)
	for _, f := range fs {
		switch f.Delivery.ID {
		case stale.ID:
			wantCode(t, "the batch's finish under a lost claim", f.Err, chargeonce.ESTALE)
		default:
			if f.Err != nil || f.Disabled {
				t.Fatalf("finishing delivery %d in a batch: disabled=%v, %v", f.Delivery.ID, f.Disabled, f.Err)
			}
		}
	}
	for _, f := range fs {
		_, attempts, err := s.WebhookEventGet(t.Context(), "m1", f.Delivery.Event.ID)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, a := range attempts {
			if a.EndpointID == f.Delivery.Endpoint.ID {
				n++
				if a.StatusCode != f.Outcome.Attempt.StatusCode || a.Latency != f.Outcome.Attempt.Latency {
					t.Fatalf("attempt %+v recorded for %+v", a, f.Outcome.Attempt)
				}
			}
		}
		if n != 1 {
			t.Fatalf("event %s to %s: %d attempts recorded, want 1", f.Delivery.Event.ID, f.Delivery.Endpoint.ID, n)
		}
	}
	// Only the stale one is still held (by its real claim); the failed one
	// waits an hour; the delivered ones are done.
	if ds := claimDeliveries(t, s, longLease); len(ds) != 0 {
		t.Fatalf("claimed after the batch: %+v", ds)
	}
	// e2 answered 2xx in the batch after its failure: its clock stopped, so
	// a failure past DisableAfter does not disable it.
	if _, err := s.WebhookEventRedeliver(t.Context(), "m1", failed.Event.ID); err != nil {
		t.Fatal(err)
	}
	for _, d := range claimDeliveries(t, s, longLease) {
		disabled, err := s.WebhookDeliveryFinish(t.Context(), d, chargeonce.WebhookOutcome{
			Attempt: chargeonce.WebhookAttempt{StatusCode: 500}, RetryIn: time.Hour, DisableAfter: time.Nanosecond})
		if err != nil || disabled {
			t.Fatalf("a failure right after a batch's 2xx: disabled=%v, %v (the batch left the failure clock running)", disabled, err)
		}
	}
	// An empty batch is nothing to do.
	s.WebhookDeliveriesFinish(t.Context(), nil)
}

// testWebhookFinishBatchRace: deliveries claimed, lost when their lease
// ended and claimed again, are finished by both claimants' batches at once,
// over and over: each delivery ends once, by the claim that holds it, and
// the other claimant's finish is ESTALE.
func testWebhookFinishBatchRace(t *testing.T, s chargeonce.Store) {
	addEndpoint(t, s, "m1")
	const n = 20
	for i := range n {
		settle(t, s, "m1", fmt.Sprintf("k%d", i))
	}
	old := claimDeliveries(t, s, 50*time.Millisecond)
	time.Sleep(100 * time.Millisecond)
	cur := claimDeliveries(t, s, longLease)
	if len(old) != n || len(cur) != n {
		t.Fatalf("claimed %d then %d, want %d each", len(old), len(cur), n)
	}
	batch := func(ds []chargeonce.WebhookDelivery) []chargeonce.WebhookFinish {
		fs := make([]chargeonce.WebhookFinish, len(ds))
		for i, d := range ds {
			fs[i] = chargeonce.WebhookFinish{Delivery: d, Outcome: chargeonce.WebhookOutcome{
				Attempt: chargeonce.WebhookAttempt{StatusCode: http.StatusOK}, Delivered: true}}
		}
		return fs
	}
	// Several racers per claimant, each finishing the whole batch.
	var (
		wg      sync.WaitGroup
		results [8][]chargeonce.WebhookFinish
	)
	for i := range results {
		ds := old
		if i%2 == 1 {
			ds = cur
		}
		results[i] = batch(ds)
		wg.Go(func() { s.WebhookDeliveriesFinish(t.Context(), results[i]) })
	}
	wg.Wait()
	ended := map[int64]int{}
	for i, fs := range results {
		for _, f := range fs {
			switch code := chargeonce.ErrorCode(f.Err); {
			case f.Err == nil:
				if i%2 == 0 {
					t.Fatalf("delivery %d ended by the claim it lost", f.Delivery.ID)
				}
				ended[f.Delivery.ID]++
			case code != chargeonce.ESTALE:
				t.Fatalf("racing batches: delivery %d: %v", f.Delivery.ID, f.Err)
			}
		}
	}
	for _, d := range cur {
		if ended[d.ID] != 1 {
			t.Fatalf("delivery %d ended %d times, want once", d.ID, ended[d.ID])
		}
	}
}

// testWebhookClaimReadsCharge: a claimed delivery's Charge, when the store
// reads it with the claim, is the charge as ChargeGet returns it.
func testWebhookClaimReadsCharge(t *testing.T, s chargeonce.Store) {
	addEndpoint(t, s, "m1")
	p := settle(t, s, "m1", "k1")
	ds := claimDeliveries(t, s, longLease)
	if len(ds) != 1 {
		t.Fatalf("claimed %d", len(ds))
	}
	if ds[0].Charge == nil {
		return // this store leaves it to the sender
	}
	want, err := s.ChargeGet(t.Context(), "m1", p.Charge.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := *ds[0].Charge; got.ID != want.ID || got.MerchantID != want.MerchantID || got.Status != want.Status ||
		got.AmountCents != want.AmountCents || !got.CreatedAt.Equal(want.CreatedAt) {
		t.Fatalf("claimed delivery's charge %+v, want %+v", got, want)
	}
}

// testWebhookEndpointConcurrency: max_concurrency is stored at creation
// and by an update, 0 meaning the default, and out of its bounds refused
// naming it, with nothing written.
func testWebhookEndpointConcurrency(t *testing.T, s chargeonce.Store) {
	e := addEndpoint(t, s, "m1")
	if e.MaxConcurrency != 0 || e.Concurrency() != chargeonce.DefaultEndpointConcurrency {
		t.Fatalf("new endpoint's concurrency %d (%d), want the default", e.MaxConcurrency, e.Concurrency())
	}
	e4, err := s.WebhookEndpointCreate(t.Context(), chargeonce.WebhookEndpoint{
		ID: "we_" + randHex(8), MerchantID: "m1", URL: "https://example.com/hook", Secret: "whsec_" + randHex(16), MaxConcurrency: 4})
	if err != nil || e4.MaxConcurrency != 4 {
		t.Fatalf("create with max_concurrency 4: %+v, %v", e4, err)
	}
	for _, bad := range []int{-1, chargeonce.MaxEndpointConcurrency + 1} {
		_, err := s.WebhookEndpointCreate(t.Context(), chargeonce.WebhookEndpoint{
			ID: "we_" + randHex(8), MerchantID: "m1", URL: "https://example.com/hook", Secret: "whsec_" + randHex(16), MaxConcurrency: bad})
		wantCode(t, fmt.Sprintf("create with max_concurrency %d", bad), err, chargeonce.EINVALID)
		if ce, ok := errors.AsType[*chargeonce.Error](err); !ok || ce.Field != "max_concurrency" {
			t.Fatalf("create with max_concurrency %d: %v, want an error naming max_concurrency", bad, err)
		}
	}
	for _, bad := range []int{0, chargeonce.MaxEndpointConcurrency + 1} {
		_, err := s.WebhookEndpointUpdate(t.Context(), "m1", e.ID, chargeonce.WebhookEndpointUpdate{MaxConcurrency: &bad})
		wantCode(t, fmt.Sprintf("update to max_concurrency %d", bad), err, chargeonce.EINVALID)
	}
	n := chargeonce.MaxEndpointConcurrency
	got, err := s.WebhookEndpointUpdate(t.Context(), "m1", e.ID, chargeonce.WebhookEndpointUpdate{MaxConcurrency: &n})
	if err != nil || got.MaxConcurrency != n {
		t.Fatalf("update to max_concurrency %d: %+v, %v", n, got, err)
	}
	desc := "kept"
	got, err = s.WebhookEndpointUpdate(t.Context(), "m1", e.ID, chargeonce.WebhookEndpointUpdate{Description: &desc})
	if err != nil || got.MaxConcurrency != n {
		t.Fatalf("an update of another field changed max_concurrency: %+v, %v", got, err)
	}
	list, err := s.WebhookEndpointsList(t.Context(), "m1")
	if err != nil || len(list) != 2 {
		t.Fatalf("WebhookEndpointsList: %+v, %v", list, err)
	}
	want := map[string]int{e.ID: n, e4.ID: 4}
	for _, l := range list {
		if w, ok := want[l.ID]; ok && l.MaxConcurrency != w {
			t.Fatalf("listed %s with max_concurrency %d, want %d", l.ID, l.MaxConcurrency, w)
		}
	}
	addEndpoint(t, s, "m2")
	settle(t, s, "m1", "k1")
	for _, d := range claimDeliveries(t, s, longLease) {
		if w, ok := want[d.Endpoint.ID]; ok && d.Endpoint.MaxConcurrency != w {
			t.Fatalf("claimed a delivery to %s with max_concurrency %d, want %d", d.Endpoint.ID, d.Endpoint.MaxConcurrency, w)
		}
	}
}
