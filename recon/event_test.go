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
