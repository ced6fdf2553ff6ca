package client_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/client"
	"github.com/chargeonce/chargeonce/engine"
)

// TestListChargesPagesAndIterator: ListCharges answers one page; AllCharges
// follows the pages, one request each, and yields every charge once,
// newest first; breaking out of the loop stops the requests; a mistake is
// yielded once, as the error it is.
func TestListChargesPagesAndIterator(t *testing.T) {
	t.Parallel()
	f := setup(t, "sqlite", engine.Options{}, acquirer.Options{})
	var log attemptLog
	c := newClient(t, f.inst.URL, log.hook())
	ctx := context.Background()
	order := orderSeq.Add(1)
	var want []string // newest first
	for range 13 {
		ch, err := c.CreateCharge(ctx, charge(order, "tok_ok"))
		if err != nil {
			t.Fatalf("CreateCharge: %v", err)
		}
		want = append([]string{ch.ID}, want...)
	}

	page, err := c.ListCharges(ctx, client.ListParams{OrderID: order, Limit: 5})
	if err != nil {
		t.Fatalf("ListCharges: %v", err)
	}
	var ids []string
	for _, ch := range page.Charges {
		ids = append(ids, ch.ID)
	}
	if !slices.Equal(ids, want[:5]) || !page.HasMore {
		t.Fatalf("first page = %v, has_more %v; want %v, true", ids, page.HasMore, want[:5])
	}
	page, err = c.ListCharges(ctx, client.ListParams{OrderID: order, Limit: 5, EndingBefore: want[5]})
	if err != nil || len(page.Charges) != 5 || page.Charges[0].ID != want[0] || page.HasMore {
		t.Fatalf("the page before %s = %+v, %v; want the newest 5 and no more", want[5], page, err)
	}

	before := len(mustAttempts(&log))
	ids = nil
	for ch, err := range c.AllCharges(ctx, client.ListParams{OrderID: order, Limit: 4}) {
		if err != nil {
			t.Fatalf("AllCharges: %v", err)
		}
		ids = append(ids, ch.ID)
	}
	if !slices.Equal(ids, want) {
		t.Fatalf("AllCharges = %v, want each charge once, newest first: %v", ids, want)
	}
	if n := len(mustAttempts(&log)) - before; n != 4 {
		t.Fatalf("AllCharges of 13 charges by 4 made %d requests, want 4", n)
	}

	before = len(mustAttempts(&log))
	ids = nil
	for ch, err := range c.AllCharges(ctx, client.ListParams{OrderID: order, Limit: 4}) {
		if err != nil {
			t.Fatalf("AllCharges: %v", err)
		}
		if ids = append(ids, ch.ID); len(ids) == 6 {
			break
		}
	}
	if n := len(mustAttempts(&log)) - before; !slices.Equal(ids, want[:6]) || n != 2 {
		t.Fatalf("AllCharges stopped after 6 = %v with %d requests, want %v with 2", ids, n, want[:6])
	}

	var errs []error
	for _, err := range c.AllCharges(ctx, client.ListParams{Status: "refunded"}) {
		errs = append(errs, err)
	}
	var ve *client.ValidationError
	if len(errs) != 1 || !errors.As(errs[0], &ve) || ve.Problem.Field != "status" {
		t.Fatalf("AllCharges with an unknown status yielded %v, want one *ValidationError naming status", errs)
	}
}

func mustAttempts(l *attemptLog) []client.Attempt {
	a, _ := l.attempts()
	return a
}
