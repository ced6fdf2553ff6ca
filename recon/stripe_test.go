package recon_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/acquirer/stripe"
	"github.com/chargeonce/chargeonce/recon"
)

// stripeList serves Stripe's PaymentIntent list with the objects given
// (one page) and an empty Refund list: Stripe's view of a day, for the
// Stripe ledger.
func stripeList(t *testing.T, pis []map[string]any) *stripe.Ledger {
	t.Helper()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		data := []map[string]any{}
		if r.URL.Path == "/v1/payment_intents" {
			data = pis
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "url": r.URL.Path, "has_more": false, "data": data})
	}))
	t.Cleanup(hs.Close)
	retries := int64(0)
	acq, err := stripe.New(stripe.Options{Key: "sk_test_123", APIBase: hs.URL, MaxNetworkRetries: &retries})
	if err != nil {
		t.Fatal(err)
	}
	l := acq.Ledger(stripe.LedgerOptions{})
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// paymentIntent is the PaymentIntent Stripe would list for our manual
// charge c in status, amount_received received.
func paymentIntent(c chargeonce.Charge, status string, received int64) map[string]any {
	pi := map[string]any{
		"id": "pi_" + c.ID[3:], "object": "payment_intent", "amount": c.AmountCents, "amount_received": received,
		"currency": "brl", "status": status, "capture_method": "manual", "created": c.CreatedAt.Unix(),
		"latest_charge": map[string]any{"id": "ch_s" + c.ID[3:], "object": "charge", "status": "succeeded", "captured": status == "succeeded"},
		"metadata":      map[string]string{"chargeonce_reference": c.ID, "merchant": c.MerchantID, "order_id": strconv.FormatInt(c.OrderID, 10)},
	}
	if status == "canceled" {
		pi["canceled_at"] = time.Now().Unix()
	}
	return pi
}

// Our manual captures and voids join with Stripe's PaymentIntents by the
// charge's reference, although Stripe keeps no reference of the capture or
// the void: an authorization still open, one captured in part, one voided
// reconcile clean; a PaymentIntent that received another amount than we
// captured is an amount_mismatch of the manual capture, once.
func TestManualCapturesAgainstStripeLedger(t *testing.T) {
	t.Parallel()
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := setup(t, kind, acquirer.Options{})
			ids := []string{e.authorize(t), e.authorize(t), e.authorize(t), e.authorize(t)}
			e.settle(t, ids[1], chargeonce.KindCapture, 1000)
			e.settle(t, ids[2], chargeonce.KindCancel, 0)
			e.settle(t, ids[3], chargeonce.KindCapture, 2500)
			var charges []chargeonce.Charge
			for _, id := range ids {
				c, err := e.store.ChargeGet(t.Context(), "demo", id)
				if err != nil {
					t.Fatal(err)
				}
				charges = append(charges, c)
			}
			pis := []map[string]any{
				paymentIntent(charges[0], "requires_capture", 0),
				paymentIntent(charges[1], "succeeded", 1000),
				paymentIntent(charges[2], "canceled", 0),
				paymentIntent(charges[3], "succeeded", 2000), // we captured 2,500
			}
			now := time.Now()
			for _, page := range []int{1, 1000} {
				rep, err := recon.Run(t.Context(), e.recon, stripeList(t, pis), recon.Options{
					Acquirer: "stripe", Period: "test", From: now.Add(-time.Hour), To: now.Add(time.Hour), Margin: time.Hour, PageSize: page,
				})
				if err != nil {
					t.Fatal(err)
				}
				wantOnly(t, rep, map[recon.Type]int{recon.AmountMismatch: 1}, ids[3])
				for _, m := range rep.Mismatches {
					if m.Kind != chargeonce.LedgerManualCapture || m.OurAmountCents != 2500 || m.AcquirerAmountCents != 2000 || m.ObjectReference == "" {
						t.Errorf("page %d: %+v, want the manual capture of 2,500 against 2,000, naming our capture", page, m)
					}
				}
				if rep.Charges != 4 || rep.Operations != 3 || rep.LedgerEntries != 7 || rep.Matched != 3 {
					t.Errorf("page %d: charges=%d operations=%d ledger=%d matched=%d, want 4 3 7 3", page, rep.Charges, rep.Operations, rep.LedgerEntries, rep.Matched)
				}
			}
		})
	}
}

// stripeListCreated is stripeList honouring created[gte] and created[lt], as
// Stripe does: a period lists only the PaymentIntents created in it.
func stripeListCreated(t *testing.T, pis []map[string]any) *stripe.Ledger {
	t.Helper()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		data := []map[string]any{}
		if r.URL.Path == "/v1/payment_intents" {
			q := r.URL.Query()
			gte, err1 := strconv.ParseInt(q.Get("created[gte]"), 10, 64)
			lt, err2 := strconv.ParseInt(q.Get("created[lt]"), 10, 64)
			if err1 != nil || err2 != nil {
				http.Error(w, "created[gte] and created[lt] are required", http.StatusBadRequest)
				return
			}
			for _, pi := range pis {
				if c := pi["created"].(int64); c >= gte && c < lt {
					data = append(data, pi)
				}
			}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "url": r.URL.Path, "has_more": false, "data": data})
	}))
	t.Cleanup(hs.Close)
	retries := int64(0)
	acq, err := stripe.New(stripe.Options{Key: "sk_test_123", APIBase: hs.URL, MaxNetworkRetries: &retries})
	if err != nil {
		t.Fatal(err)
	}
	l := acq.Ledger(stripe.LedgerOptions{})
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// Stripe lists a PaymentIntent, its capture included, by its creation: an
// authorization captured days later (here, seconds past a margin of half a
// second) has its capture on the authorization's day at Stripe and on the
// capture's day with us. Each day looks the other side up by the charge's
// reference, and both reconcile clean.
func TestStripeCaptureDaysAfterAuthorization(t *testing.T) {
	t.Parallel()
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := setup(t, kind, acquirer.Options{})
			id := e.authorize(t)
			c, err := e.store.ChargeGet(t.Context(), "demo", id)
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(2500 * time.Millisecond) // the capture "days" later: past both margins and Stripe's whole seconds
			e.settle(t, id, chargeonce.KindCapture, 2000)
			// Midnight: 1.7 s after the authorization, ours settled 0.8 s or
			// more after it.
			midnight := c.CreatedAt.Add(1700 * time.Millisecond)
			ledger := stripeListCreated(t, []map[string]any{paymentIntent(c, "succeeded", 2000)})
			for _, day := range []struct {
				name     string
				from, to time.Time
			}{
				{"the authorization's day", midnight.Add(-24 * time.Hour), midnight},
				{"the capture's day", midnight, midnight.Add(24 * time.Hour)},
			} {
				rep, err := recon.Run(t.Context(), e.recon, ledger, recon.Options{
					Acquirer: "stripe", Period: day.name, From: day.from, To: day.to, Margin: 500 * time.Millisecond,
				})
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("%s: counts %v matched %d charges %d operations %d ledger %d", day.name, rep.Counts, rep.Matched, rep.Charges, rep.Operations, rep.LedgerEntries)
				wantOnly(t, rep, nil)
				if rep.Matched != 1 {
					t.Errorf("%s: matched %d, want 1", day.name, rep.Matched)
				}
				if len(rep.Notes) != 1 {
					t.Errorf("%s: notes %+v, want the capture joined across the window", day.name, rep.Notes)
				}
			}
		})
	}
}
