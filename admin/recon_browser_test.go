package admin_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/recon"
)

// TestReconPageInBrowser: a stored run's exceptions are listed on the
// Reconciliation page, each linked to its charge's page; acknowledging one
// with a note (a form, no script) records who and when, shows it in place
// of the form, and keeps the first acknowledgement; the page fits the 1280
// px window; a form posted without the console's token is refused.
func TestReconPageInBrowser(t *testing.T) {
	t.Parallel()
	e := setup(t, "postgres")
	id, _ := e.stuck(t, "recon-page-key")
	day := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	rep := &recon.Report{Acquirer: "sim", Period: "2026-12-06", From: day, To: day.AddDate(0, 0, 1), Charges: 1, LedgerEntries: 1,
		StartedAt: time.Now().UTC(), FinishedAt: time.Now().UTC(),
		Counts: map[recon.Type]int{recon.MissingAtAcquirer: 1, recon.MissingInternal: 1}, Merchants: map[string]*recon.MerchantSummary{},
		Mismatches: []recon.Mismatch{
			{Type: recon.MissingAtAcquirer, Kind: chargeonce.LedgerCapture, Reference: id, Merchant: "demo", OurStatus: "captured", OurAmountCents: 2500, OurCurrency: "BRL",
				Detail: "captured by us; the acquirer has no capture under the reference"},
			{Type: recon.MissingInternal, Kind: chargeonce.LedgerCapture, Reference: "ch_unknown", Merchant: "demo", AcquirerStatus: "captured", AcquirerAmountCents: 900, AcquirerCurrency: "BRL",
				AcquirerIDs: []string{"lca_1"}, Detail: "the acquirer captured 1 time(s) under a reference we have no charge for"},
		}}
	if _, err := recon.Save(t.Context(), e.store.(chargeonce.ReconStore), rep); err != nil {
		t.Fatal(err)
	}

	ctx := browser(t)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	do, text := tab{t, ctx}.do, tab{t, ctx}.text
	fits := func() {
		t.Helper()
		width, err := chromedp.Run(ctx, chromedp.Evaluate[int]("document.documentElement.scrollWidth"))
		if err != nil {
			t.Fatal(err)
		}
		inner, err := chromedp.Run(ctx, chromedp.Evaluate[int]("window.innerWidth"))
		if err != nil {
			t.Fatal(err)
		}
		if width > inner {
			t.Errorf("the reconciliation page is %d px wide in a %d px window", width, inner)
		}
	}

	do("signing in", chromedp.Navigate(e.admin.URL+"/admin/"), chromedp.WaitVisible("#key"),
		chromedp.SendKeys("#key", aliceKey), chromedp.Submit("#key"), chromedp.WaitVisible("#stuck"))
	do("opening Reconciliation from the menu", chromedp.Click(`nav a[href="/admin/recon"]`), chromedp.WaitVisible("#recon-exceptions"))
	fits()
	shoot(ctx, t, "operators-recon")
	if runs := text("#recon-runs"); !strings.Contains(runs, "2026-12-06") || !strings.Contains(runs, "missing_at_acquirer 1") {
		t.Fatalf("the runs list:\n%s", runs)
	}
	if ex := text("#recon-exceptions"); !strings.Contains(ex, id) || !strings.Contains(ex, "ch_unknown (no charge of ours)") || !strings.Contains(ex, "25.00 BRL") {
		t.Fatalf("the exceptions:\n%s", ex)
	}
	// A reference we have no charge for has no charge page to link to.
	if n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('#recon-exceptions a[href="/admin/charges/ch_unknown"]').length`)); err != nil || n != 0 {
		t.Errorf("%d links to ch_unknown's page (%v), want none", n, err)
	}

	do("following an exception to its charge", chromedp.Click(`#recon-exceptions a[href="/admin/charges/`+id+`"]`), chromedp.WaitVisible("#timeline"))
	loc, err := chromedp.Run(ctx, chromedp.Location())
	if err != nil || !strings.HasSuffix(loc, "/admin/charges/"+id) {
		t.Fatalf("the exception's link led to %s (%v), want the charge %s", loc, err, id)
	}

	do("back to the run", chromedp.Navigate(e.admin.URL+"/admin/recon"), chromedp.WaitVisible("#recon-exceptions"))
	form := `#recon-exceptions form.ack:has(input[value="` + id + `"])`
	do("acknowledging with a note", chromedp.SendKeys(form+` input[name="note"]`, "acquirer outage on the 6th; settled by hand"),
		// The page the form posts back to has #recon-exceptions too: what
		// says it has loaded is that this exception's form is gone (CI read
		// the old page's text when the wait matched it).
		chromedp.Submit(form+` input[name="note"]`), chromedp.WaitNotPresent(form), chromedp.WaitVisible("#recon-exceptions"))
	fits()
	ex := text("#recon-exceptions")
	if !strings.Contains(ex, "alice") || !strings.Contains(ex, "acquirer outage on the 6th") {
		t.Fatalf("the acknowledged exception does not show who and why:\n%s", ex)
	}
	forms, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#recon-exceptions form.ack").length`))
	if err != nil || forms != 1 {
		t.Errorf("%d acknowledgement forms left (%v), want 1: the other exception's", forms, err)
	}
	acks, err := e.store.(chargeonce.ReconOps).ReconAcksList(t.Context(), "sim", "2026-12-06")
	if err != nil || len(acks) != 1 || acks[0].Actor != "alice" || acks[0].Reference != id || acks[0].At.IsZero() {
		t.Errorf("stored acknowledgements %+v (%v), want alice's of %s", acks, err, id)
	}

	// Without the console's token (another site's form): refused, nothing kept.
	jar := http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := jar.PostForm(e.admin.URL+"/admin/recon/ack", url.Values{"acquirer": {"sim"}, "period": {"2026-12-06"},
		"type": {"missing_internal"}, "reference": {"ch_unknown"}, "note": {"forged"}})
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusSeeOther && res.StatusCode != http.StatusForbidden {
		t.Errorf("a forged acknowledgement: %d, want refused", res.StatusCode)
	}
	if acks, _ := e.store.(chargeonce.ReconOps).ReconAcksList(t.Context(), "sim", "2026-12-06"); len(acks) != 1 {
		t.Errorf("a forged acknowledgement was kept: %+v", acks)
	}
}
