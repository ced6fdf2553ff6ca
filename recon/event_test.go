package recon_test

import (
	"encoding/json"
	"testing"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/idempotency"
	"github.com/chargeonce/chargeonce/recon"
	"github.com/chargeonce/chargeonce/webhook"
)

// A saved run tells each merchant its own counts once, in a
// reconciliation.completed event rendered as deliveries render events; a
// re-run of the period adds no event, and the event shows the latest run.
func TestRunSendsCompletedEventPerMerchant(t *testing.T) {
	t.Parallel()
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := setup(t, kind, acquirer.Options{})
			e.background(t, 4)
			c := e.record(t, chargeonce.StatusCaptured, 2500, "BRL") // missing at the acquirer
			e.capture(t, idempotency.NewChargeID(), 900, "BRL")      // merchant demo too: the simulator's entry names it
			for range 2 {
				if _, err := recon.Save(t.Context(), e.recon, e.run(t, 0, 0)); err != nil {
					t.Fatal(err)
				}
			}
			page, err := e.store.WebhookEventsList(t.Context(), chargeonce.EventsListParams{MerchantID: "demo", Limit: 100})
			if err != nil {
				t.Fatal(err)
			}
			var events []chargeonce.WebhookEvent
			for _, ev := range page.Events {
				if ev.Type == chargeonce.EventReconciliationCompleted {
					events = append(events, ev)
				}
			}
			if len(events) != 1 {
				t.Fatalf("%d reconciliation.completed events after two runs, want 1", len(events))
			}
			object, err := webhook.EventObject(t.Context(), e.store, events[0])
			if err != nil {
				t.Fatal(err)
			}
			body, err := webhook.Body(events[0], object)
			if err != nil {
				t.Fatal(err)
			}
			var got struct {
				Type string `json:"type"`
				Data struct {
					Object struct {
						Object   string         `json:"object"`
						Acquirer string         `json:"acquirer"`
						Period   string         `json:"period"`
						Charges  int            `json:"charges"`
						Matched  int            `json:"matched"`
						Runs     int            `json:"runs"`
						Counts   map[string]int `json:"counts"`
					} `json:"object"`
				} `json:"data"`
			}
			if err := json.Unmarshal(body, &got); err != nil {
				t.Fatal(err)
			}
			o := got.Data.Object
			if got.Type != chargeonce.EventReconciliationCompleted || o.Object != "reconciliation_run" || o.Acquirer != "sim" || o.Period != "test" ||
				o.Charges != 5 || o.Matched != 4 || o.Runs != 2 || o.Counts["missing_at_acquirer"] != 1 || o.Counts["missing_internal"] != 1 || len(o.Counts) != len(recon.Types) {
				t.Errorf("delivered %s; want demo's counts of the latest run (5 charges, 4 matched, %s missing at the acquirer, one capture unknown)", body, c.ID)
			}
		})
	}
}

// A merchant's share, and so its reconciliation.completed event, counts its
// captures and cancels of authorizations as it counts charges and refunds.
func TestCompletedEventCountsOperations(t *testing.T) {
	t.Parallel()
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := setup(t, kind, acquirer.Options{})
			captured, voided := e.authorize(t), e.authorize(t)
			e.settle(t, captured, chargeonce.KindCapture, 0)
			e.settle(t, voided, chargeonce.KindCancel, 0)
			rep := e.run(t, 0, 0)
			if ms := rep.Merchants["demo"]; ms == nil || ms.Operations != 2 {
				t.Fatalf("demo's summary %+v; want 2 operations", ms)
			}
			if _, err := recon.Save(t.Context(), e.recon, rep); err != nil {
				t.Fatal(err)
			}
			page, err := e.store.WebhookEventsList(t.Context(), chargeonce.EventsListParams{MerchantID: "demo", Limit: 100})
			if err != nil {
				t.Fatal(err)
			}
			for _, ev := range page.Events {
				if ev.Type != chargeonce.EventReconciliationCompleted {
					continue
				}
				object, err := webhook.EventObject(t.Context(), e.store, ev)
				if err != nil {
					t.Fatal(err)
				}
				var o struct {
					Charges    int `json:"charges"`
					Operations int `json:"operations"`
				}
				if err := json.Unmarshal(object, &o); err != nil {
					t.Fatal(err)
				}
				if o.Charges != 2 || o.Operations != 2 {
					t.Fatalf("reconciliation.completed shows %s; want 2 charges and 2 operations", object)
				}
				return
			}
			t.Fatal("no reconciliation.completed event")
		})
	}
}
