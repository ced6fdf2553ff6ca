package acquirer_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
)

// The ledger lists every settled capture, a reference captured twice (after
// its idempotency window) as two entries side by side, in reference order,
// the same pages in-process and over HTTP, at any page size.
func TestLedgerPages(t *testing.T) {
	t.Parallel()
	sim := acquirer.NewSimulator(acquirer.Options{IdempotencyWindow: 20 * time.Millisecond})
	t.Cleanup(func() { sim.Close() })
	srv := httptest.NewServer(acquirer.Handler(sim))
	t.Cleanup(srv.Close)
	start := time.Now()
	refs := []string{"ch_c", "ch_a", "ch_b", "ch_e", "ch_d"}
	for i, ref := range refs {
		tok := acquirer.TokenOK
		if i == 2 {
			tok = acquirer.TokenDeclined
		}
		if _, err := sim.Capture(t.Context(), chargeonce.CaptureRequest{Reference: ref, OrderID: int64(i + 1), Merchant: "m", AmountCents: 100, Currency: "BRL", PaymentToken: tok}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(40 * time.Millisecond)
	if _, err := sim.Capture(t.Context(), chargeonce.CaptureRequest{Reference: "ch_a", OrderID: 2, Merchant: "m", AmountCents: 100, Currency: "BRL", PaymentToken: "tok_ok"}); err != nil {
		t.Fatal(err)
	}
	want := []string{"ch_a captured", "ch_a captured", "ch_b declined", "ch_c captured", "ch_d captured", "ch_e captured"}
	client := acquirer.NewClient(srv.URL, srv.Client())
	for _, ledger := range []chargeonce.Ledger{sim, client} {
		for _, limit := range []int{1, 2, 4, 1000} {
			var got, ids []string
			p := chargeonce.LedgerParams{From: start.Add(-time.Second), To: time.Now().Add(time.Second), Limit: limit}
			for pages := 0; ; pages++ {
				if pages > 10 {
					t.Fatalf("%T limit %d: the cursor does not advance", ledger, limit)
				}
				page, err := ledger.LedgerList(t.Context(), p)
				if err != nil {
					t.Fatalf("%T: %v", ledger, err)
				}
				for _, e := range page.Entries {
					got = append(got, e.ChargeReference+" "+e.Status)
					ids = append(ids, e.ID)
				}
				if page.Next == "" {
					break
				}
				p.After = page.Next
			}
			if !slices.Equal(got, want) {
				t.Errorf("%T limit %d: %q, want %q", ledger, limit, got, want)
			}
			if len(slices.Compact(slices.Sorted(slices.Values(ids)))) != len(want) {
				t.Errorf("%T limit %d: entry ids %q are not distinct", ledger, limit, ids)
			}
		}
	}
	// A range that holds none of them.
	page, err := client.LedgerList(t.Context(), chargeonce.LedgerParams{From: start.Add(-time.Hour), To: start.Add(-time.Minute)})
	if err != nil || len(page.Entries) != 0 || page.Next != "" {
		t.Errorf("an empty range: %+v %v", page, err)
	}
}

func TestLedgerBadParams(t *testing.T) {
	t.Parallel()
	sim := acquirer.NewSimulator(acquirer.Options{})
	t.Cleanup(func() { sim.Close() })
	srv := httptest.NewServer(acquirer.Handler(sim))
	t.Cleanup(srv.Close)
	now := time.Now().UTC().Format(time.RFC3339)
	later := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	for _, tc := range []struct{ query, field string }{
		{"", "from"},
		{"from=yesterday&to=" + later, "from"},
		{"from=" + now, "to"},
		{"from=" + later + "&to=" + now, "from"},
		{"from=" + now + "&to=" + later + "&limit=0x10", "limit"},
		{"from=" + now + "&to=" + later + "&limit=1001", "limit"},
		{"from=" + now + "&to=" + later + "&limit=-1", "limit"},
		{"from=" + now + "&to=" + later + "&starting_after=" + url.QueryEscape("ch_a"), "starting_after"},
		{"from=" + now + "&to=" + later + "&starting_after=" + url.QueryEscape("ch_a x"), "starting_after"},
	} {
		resp, err := srv.Client().Get(srv.URL + "/v1/ledger?" + tc.query)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var prob struct {
			Field string `json:"field"`
		}
		_ = json.Unmarshal(body, &prob)
		if resp.StatusCode != http.StatusBadRequest || resp.Header.Get("Content-Type") != "application/problem+json" || prob.Field != tc.field {
			t.Errorf("GET /v1/ledger?%s: %d %s %s, want 400 problem+json naming %s", tc.query, resp.StatusCode, resp.Header.Get("Content-Type"), body, tc.field)
		}
	}
	resp, err := srv.Client().Post(srv.URL+"/v1/ledger", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /v1/ledger: %d, want 405", resp.StatusCode)
	}
}

// A refund the simulator settles is in its ledger beside the capture it
// refunds (its ChargeReference), failed ones too, so that reconciliation
// sums the money that went back per charge.
func TestLedgerListsRefunds(t *testing.T) {
	t.Parallel()
	sim := acquirer.NewSimulator(acquirer.Options{})
	t.Cleanup(func() { sim.Close() })
	start := time.Now()
	if _, err := sim.Capture(t.Context(), chargeonce.CaptureRequest{Reference: "ch_r", OrderID: 1, Merchant: "m", AmountCents: 100, Currency: "BRL", PaymentToken: acquirer.TokenOK}); err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		ref    string
		amount int64
	}{{"re_1", 60}, {"re_2", 60}} {
		if _, err := sim.Refund(t.Context(), chargeonce.RefundCall{Reference: r.ref, ChargeReference: "ch_r", Merchant: "m", AmountCents: r.amount, Currency: "BRL"}); err != nil {
			t.Fatal(err)
		}
	}
	page, err := sim.LedgerList(t.Context(), chargeonce.LedgerParams{From: start.Add(-time.Second), To: time.Now().Add(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range page.Entries {
		got = append(got, string(e.Kind)+" "+e.Reference+"/"+e.ChargeReference+" "+e.Status)
	}
	want := []string{"capture ch_r/ch_r captured", "refund re_1/ch_r succeeded", "refund re_2/ch_r failed"}
	if !slices.Equal(got, want) {
		t.Fatalf("ledger %q, want %q", got, want)
	}
}

// An authorization is in the ledger as one (it moves nothing), and its
// capture (for the amount captured) or void beside it, under the charge's
// reference with the operation's own, in-process and over HTTP; a capture
// or void that failed moved nothing and is not listed.
func TestLedgerListsAuthorizations(t *testing.T) {
	t.Parallel()
	sim := acquirer.NewSimulator(acquirer.Options{})
	t.Cleanup(func() { sim.Close() })
	srv := httptest.NewServer(acquirer.Handler(sim))
	t.Cleanup(srv.Close)
	start := time.Now()
	for _, ref := range []string{"ch_v", "ch_c", "ch_o"} {
		if res, err := sim.Authorize(t.Context(), chargeonce.CaptureRequest{Reference: ref, OrderID: 1, Merchant: "m", AmountCents: 100, Currency: "BRL", PaymentToken: acquirer.TokenOK}); err != nil || res.Status != chargeonce.StatusAuthorized {
			t.Fatalf("Authorize(%s) = %+v, %v", ref, res, err)
		}
	}
	call := func(ref, charge string, amount int64) chargeonce.OperationCall {
		return chargeonce.OperationCall{Reference: ref, ChargeReference: charge, Merchant: "m", AmountCents: amount, Currency: "BRL"}
	}
	if res, err := sim.CaptureAuthorized(t.Context(), call("cp_c", "ch_c", 40)); err != nil || res.Status != chargeonce.OperationSucceeded {
		t.Fatalf("CaptureAuthorized = %+v, %v", res, err)
	}
	if res, err := sim.Void(t.Context(), call("vd_v", "ch_v", 100)); err != nil || res.Status != chargeonce.OperationSucceeded {
		t.Fatalf("Void = %+v, %v", res, err)
	}
	if res, err := sim.Void(t.Context(), call("vd_c", "ch_c", 100)); err != nil || res.Status != chargeonce.OperationFailed {
		t.Fatalf("Void of a captured authorization = %+v, %v", res, err)
	}
	want := []string{
		"authorization ch_c/ch_c 100 authorized", "manual_capture cp_c/ch_c 40 succeeded",
		"authorization ch_o/ch_o 100 authorized",
		"authorization ch_v/ch_v 100 authorized", "void vd_v/ch_v 100 succeeded",
	}
	for _, ledger := range []chargeonce.Ledger{sim, acquirer.NewClient(srv.URL, srv.Client())} {
		page, err := ledger.LedgerList(t.Context(), chargeonce.LedgerParams{From: start.Add(-time.Second), To: time.Now().Add(time.Second)})
		if err != nil {
			t.Fatalf("%T: %v", ledger, err)
		}
		var got []string
		for _, e := range page.Entries {
			got = append(got, fmt.Sprintf("%s %s/%s %d %s", e.Kind, e.Reference, e.ChargeReference, e.AmountCents, e.Status))
		}
		if !slices.Equal(got, want) {
			t.Errorf("%T: ledger\n%q\nwant\n%q", ledger, got, want)
		}
	}
}
