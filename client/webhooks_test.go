package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/client"
	"github.com/chargeonce/chargeonce/engine"
)

// TestWebhookMethods drives the endpoints and events API through the
// client: create, list, disable and enable again, an event of a settled
// charge, its redelivery (a 202 that is final, not retried), its
// attempts, recovery, and deletion.
func TestWebhookMethods(t *testing.T) {
	t.Parallel()
	f := setup(t, "sqlite", engine.Options{}, acquirer.Options{})
	var log attemptLog
	c := newClient(t, f.inst.URL, log.hook())
	ctx := context.Background()
	e, err := c.CreateWebhookEndpoint(ctx, client.WebhookEndpointParams{URL: "https://hooks.example.com/in", EnabledEvents: []string{"charge.captured"}})
	if err != nil || e.Secret == "" || e.Status != "enabled" || len(e.EnabledEvents) != 1 {
		t.Fatalf("CreateWebhookEndpoint = %+v, %v", e, err)
	}
	eps, err := c.ListWebhookEndpoints(ctx)
	if err != nil || len(eps) != 1 || eps[0].ID != e.ID || eps[0].Secret != "" {
		t.Fatalf("ListWebhookEndpoints = %+v, %v", eps, err)
	}
	yes, no := true, false
	if u, err := c.UpdateWebhookEndpoint(ctx, e.ID, client.WebhookEndpointUpdate{Disabled: &yes}); err != nil || u.Status != "disabled" {
		t.Fatalf("disable = %+v, %v", u, err)
	}
	if u, err := c.UpdateWebhookEndpoint(ctx, e.ID, client.WebhookEndpointUpdate{Disabled: &no}); err != nil || u.Status != "enabled" {
		t.Fatalf("enable = %+v, %v", u, err)
	}
	ch, err := c.CreateCharge(ctx, charge(orderSeq.Add(1), "tok_ok"))
	if err != nil {
		t.Fatal(err)
	}
	page, err := c.ListEvents(ctx, ch.ID, "", 10)
	if err != nil || len(page.Events) != 1 || page.Events[0].Type != "charge.captured" {
		t.Fatalf("ListEvents = %+v, %v", page, err)
	}
	evID := page.Events[0].ID
	start := time.Now()
	if n, err := c.RedeliverEvent(ctx, evID); err != nil || n != 1 || time.Since(start) > 5*time.Second {
		t.Fatalf("RedeliverEvent = %d, %v after %s", n, err, time.Since(start))
	}
	ev, err := c.GetEvent(ctx, evID)
	if err != nil || ev.ID != evID || len(ev.Data.Object) == 0 {
		t.Fatalf("GetEvent = %+v, %v", ev, err)
	}
	if ap, err := c.ListEventAttempts(ctx, evID, "", 5); err != nil || ap.HasMore {
		t.Fatalf("ListEventAttempts = %+v, %v", ap, err)
	}
	if n, err := c.RecoverWebhookEndpoint(ctx, e.ID, time.Now().Add(-time.Hour)); err != nil || n != 0 {
		t.Fatalf("RecoverWebhookEndpoint = %d, %v", n, err)
	}
	if _, err := c.RotateWebhookSecret(ctx, e.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteWebhookEndpoint(ctx, e.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteWebhookEndpoint(ctx, e.ID); err == nil {
		t.Fatal("deleting it twice: no error")
	}
}
