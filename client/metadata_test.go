package client_test

import (
	"context"
	"maps"
	"testing"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
)

// TestMetadataRoundTrips: the client sends metadata and a lower-case
// currency, and reads the charge back with its metadata and BRL.
func TestMetadataRoundTrips(t *testing.T) {
	t.Parallel()
	f := setup(t, "sqlite", engine.Options{}, acquirer.Options{})
	c := newClient(t, f.inst.URL)
	req := charge(orderSeq.Add(1), acquirer.TokenOK)
	req.Currency = "brl"
	req.Metadata = map[string]string{"order_ref": "A-1", "note": "é"}
	ch, err := c.CreateCharge(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if ch.Currency != "BRL" || !maps.Equal(ch.Metadata, req.Metadata) {
		t.Fatalf("charge %+v; want BRL and metadata %v", ch, req.Metadata)
	}
	got, err := c.GetCharge(context.Background(), ch.ID)
	if err != nil || !maps.Equal(got.Metadata, req.Metadata) {
		t.Fatalf("GetCharge = %+v, %v", got, err)
	}
}
