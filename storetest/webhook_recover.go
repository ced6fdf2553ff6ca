package storetest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
)

// testWebhookDisablesRaceSenders: a merchant disables and enables its
// endpoints, each from several goroutines, while senders record failed
// attempts (some 410s, which disable the endpoint too) of the deliveries
// to them. Every call succeeds: on PostgreSQL a disable held the endpoint
// and waited for a delivery the sender had updated, while the sender
// waited for the endpoint (deadlock detected, 503 to the merchant; issue
// 48, item 1).
func testWebhookDisablesRaceSenders(t *testing.T, s chargeonce.Store) {
	ctx := t.Context()
	var eps []chargeonce.WebhookEndpoint
	for range 4 {
		eps = append(eps, addEndpoint(t, s, "m1"))
	}
	const n = 24
	for i := range n {
		settle(t, s, "m1", fmt.Sprintf("k%02d", i))
	}
	evs := events(t, s, "m1")
	yes, no := true, false
	for round := range 6 {
		ds, err := s.WebhookDeliveriesClaim(ctx, longLease, 1000, 1000, nil)
		if err != nil {
			t.Fatalf("round %d: WebhookDeliveriesClaim: %v", round, err)
		}
		var wg sync.WaitGroup
		for i, d := range ds {
			wg.Go(func() {
				o := chargeonce.WebhookOutcome{Attempt: chargeonce.WebhookAttempt{StatusCode: 500, EventID: d.Event.ID, EndpointID: d.Endpoint.ID},
					RetryIn: time.Millisecond, DisableAfter: time.Hour}
				if i%5 == 1 {
					// A success, in a batch: it stops the endpoint's
					// failure clock.
					fs := []chargeonce.WebhookFinish{{Delivery: d, Outcome: chargeonce.WebhookOutcome{
						Attempt: chargeonce.WebhookAttempt{StatusCode: 200, EventID: d.Event.ID, EndpointID: d.Endpoint.ID}, Delivered: true}}}
					s.WebhookDeliveriesFinish(ctx, fs)
					if err := fs[0].Err; err != nil && chargeonce.ErrorCode(err) != chargeonce.ESTALE {
						t.Errorf("round %d: WebhookDeliveriesFinish: %v", round, err)
					}
					return
				}
				if i%7 == 0 {
					o.Attempt.StatusCode, o.RetryIn, o.Disable = http.StatusGone, 0, "the endpoint answered 410 Gone"
				}
				if _, err := s.WebhookDeliveryFinish(ctx, d, o); err != nil && chargeonce.ErrorCode(err) != chargeonce.ESTALE {
					t.Errorf("round %d: WebhookDeliveryFinish: %v", round, err)
				}
			})
		}
		for _, e := range eps {
			for g := range 3 {
				wg.Go(func() {
					for k := range 4 {
						u := chargeonce.WebhookEndpointUpdate{Disabled: &yes}
						if (g+k)%2 == 1 {
							u.Disabled = &no
						}
						if _, err := s.WebhookEndpointUpdate(ctx, "m1", e.ID, u); err != nil {
							t.Errorf("round %d: disabled=%v of %s: %v", round, *u.Disabled, e.ID, err)
						}
					}
				})
			}
		}
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		// Every endpoint enabled again, every event owed again.
		for _, e := range eps {
			if _, err := s.WebhookEndpointUpdate(ctx, "m1", e.ID, chargeonce.WebhookEndpointUpdate{Disabled: &no}); err != nil {
				t.Fatal(err)
			}
		}
		for _, ev := range evs {
			if _, err := s.WebhookEventRedeliver(ctx, "m1", ev.ID); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// recoverFailed recovers every failed delivery of the endpoint since,
// without a cooldown, and returns how many it queued.
func recoverFailed(ctx context.Context, s chargeonce.Store, merchant, id string, since time.Time) (int, error) {
	r, err := s.WebhookEndpointRecover(ctx, chargeonce.WebhookRecoverParams{MerchantID: merchant, EndpointID: id, Since: since, Limit: 1000})
	return r.Queued, err
}

// failAll ends every pending delivery of the merchant's endpoint e as
// failed (a disable), then enables it again.
func failAll(t *testing.T, s chargeonce.Store, merchant string, e chargeonce.WebhookEndpoint, enable chargeonce.WebhookEndpointUpdate) {
	t.Helper()
	yes, no := true, false
	if _, err := s.WebhookEndpointUpdate(t.Context(), merchant, e.ID, chargeonce.WebhookEndpointUpdate{Disabled: &yes}); err != nil {
		t.Fatal(err)
	}
	enable.Disabled = &no
	if _, err := s.WebhookEndpointUpdate(t.Context(), merchant, e.ID, enable); err != nil {
		t.Fatal(err)
	}
}

func pendingCount(t *testing.T, s chargeonce.Store) int {
	t.Helper()
	st, err := s.WebhookStats(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return st.Pending
}

// testWebhookRecoverBounded: a recovery queues at most its Limit, says
// where the next goes on from (each failed event then owed once, across
// calls and across failed deliveries of one event), and is refused
// ERATELIMITED within the endpoint's cooldown, queuing nothing (issue 48:
// one call owed every failed event, uncapped).
func testWebhookRecoverBounded(t *testing.T, s chargeonce.Store) {
	ctx := t.Context()
	e := addEndpoint(t, s, "m1")
	const n = 25
	for i := range n {
		settle(t, s, "m1", fmt.Sprintf("k%02d", i))
	}
	failAll(t, s, "m1", e, chargeonce.WebhookEndpointUpdate{})
	since := time.Now().Add(-time.Hour)
	var pages []int
	p := chargeonce.WebhookRecoverParams{MerchantID: "m1", EndpointID: e.ID, Since: since, Limit: 10}
	for {
		r, err := s.WebhookEndpointRecover(ctx, p)
		if err != nil {
			t.Fatalf("recover page %d: %v", len(pages)+1, err)
		}
		pages = append(pages, r.Queued)
		if !r.HasMore {
			break
		}
		if r.Next.Before(p.Since) || len(pages) > n {
			t.Fatalf("page %d: next %s before since %s, or no end (%v)", len(pages), r.Next, p.Since, pages)
		}
		p.Since = r.Next
	}
	if fmt.Sprint(pages) != "[10 10 5]" && fmt.Sprint(pages) != "[10 10 5 0]" {
		t.Fatalf("pages of 10 queued %v, want [10 10 5]", pages)
	}
	if got := pendingCount(t, s); got != n {
		t.Fatalf("%d pending after paging, want %d: each failed event once", got, n)
	}
	// Failed twice each: one delivery owed per event all the same.
	failAll(t, s, "m1", e, chargeonce.WebhookEndpointUpdate{})
	if got, err := recoverFailed(ctx, s, "m1", e.ID, since); err != nil || got != n {
		t.Fatalf("recover of %d events failed twice each = %d, %v; want %d", n, got, err, n)
	}
	// The cooldown: counted from the last recovery of the endpoint,
	// whatever its own was; refused with what is left of it, queuing
	// nothing.
	failAll(t, s, "m1", e, chargeonce.WebhookEndpointUpdate{})
	p = chargeonce.WebhookRecoverParams{MerchantID: "m1", EndpointID: e.ID, Since: since, Limit: 10, Cooldown: time.Hour}
	_, err := s.WebhookEndpointRecover(ctx, p)
	var ce *chargeonce.Error
	if !errors.As(err, &ce) || ce.Code != chargeonce.ERATELIMITED || ce.RetryAfter < 50*time.Minute {
		t.Fatalf("recover within the cooldown: %v; want ERATELIMITED with about an hour's Retry-After", err)
	}
	if got := pendingCount(t, s); got != 0 {
		t.Fatalf("%d pending after a recovery refused, want 0", got)
	}
	// Another endpoint has a cooldown of its own.
	other := addEndpoint(t, s, "m1")
	p.EndpointID = other.ID
	if _, err := s.WebhookEndpointRecover(ctx, p); err != nil {
		t.Fatalf("recover of another endpoint: %v", err)
	}
	if _, err := s.WebhookEndpointRecover(ctx, p); chargeonce.ErrorCode(err) != chargeonce.ERATELIMITED {
		t.Fatalf("recover of the other endpoint again: %v; want ERATELIMITED", err)
	}
}

// testWebhookRecoverEnabledEvents: a recovery owes the endpoint only the
// event types it asks for now (issue 48: charge.captured was owed to an
// endpoint of charge.declined).
func testWebhookRecoverEnabledEvents(t *testing.T, s chargeonce.Store) {
	ctx := t.Context()
	e := addEndpoint(t, s, "m1")
	settle(t, s, "m1", "k-captured")
	p := newIntent("m1", "k-declined")
	insert(t, s, p)
	if err := s.KeyComplete(ctx, chargeonce.KeyCompleteParams{MerchantID: "m1", Key: "k-declined", Token: p.Token,
		ChargeStatus: chargeonce.StatusDeclined, DeclineCode: "card_declined", ResponseStatus: 402, ResponseBody: []byte(`{}`), TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	declined := []string{chargeonce.EventChargeDeclined}
	failAll(t, s, "m1", e, chargeonce.WebhookEndpointUpdate{EnabledEvents: &declined})
	if n, err := recoverFailed(ctx, s, "m1", e.ID, time.Now().Add(-time.Hour)); err != nil || n != 1 {
		t.Fatalf("recover = %d, %v; want the declined event alone", n, err)
	}
	ds := claimDeliveries(t, s, longLease)
	if len(ds) != 1 || ds[0].Event.Type != chargeonce.EventChargeDeclined {
		t.Fatalf("claimed %+v after recovery; want the declined event alone", ds)
	}
}
