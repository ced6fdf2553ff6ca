package admin_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/chargeonce/chargeonce"
)

// TestConsoleOperationInBrowser drives the console in headless Chromium
// for a manual capture whose answer was lost (issue 35, item 5): the stuck
// list shows it as a capture of its charge, in a group of its own; its
// page shows its timeline; the acquirer is asked before the form (no
// outcome preselected); the confirmation warns when the choice goes
// against the acquirer; the confirmed resolution settles the capture and
// its charge, and the audit trail links it. Every page fits the 1280 px
// window and shows no secret.
func TestConsoleOperationInBrowser(t *testing.T) {
	t.Parallel()
	e := setup(t, "postgres")
	const key = "capture-8841-secretish"
	chargeID, opID := e.stuckOperation(t, chargeonce.KindCapture, key, 125000, `{"amount_cents":99000}`)
	ctx := browser(t)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()

	do, text := tab{t, ctx}.do, tab{t, ctx}.text
	var widths []int
	page := func() {
		t.Helper()
		html, err := chromedp.Run(ctx, chromedp.OuterHTML("html"))
		if err != nil {
			t.Fatal(err)
		}
		loc, err := chromedp.Run(ctx, chromedp.Location())
		if err != nil {
			t.Fatal(err)
		}
		for _, secret := range []string{aliceKey, key, "tok_ok"} {
			if strings.Contains(html, secret) || strings.Contains(loc, secret) {
				t.Fatalf("page %s shows %q", loc, secret)
			}
		}
		width, err := chromedp.Run(ctx, chromedp.Evaluate[int]("document.documentElement.scrollWidth"))
		if err != nil {
			t.Fatal(err)
		}
		inner, err := chromedp.Run(ctx, chromedp.Evaluate[int]("window.innerWidth"))
		if err != nil {
			t.Fatal(err)
		}
		if width > inner {
			t.Errorf("page %s is %d px wide in a %d px window", loc, width, inner)
		}
		widths = append(widths, width)
	}

	do("signing in", chromedp.Navigate(e.admin.URL+"/admin/"), chromedp.WaitVisible("#key"),
		chromedp.SendKeys("#key", aliceKey), chromedp.Submit("#key"), chromedp.WaitVisible("#stuck"))
	page()
	if list := text("#stuck"); !strings.Contains(list, opID) || !strings.Contains(list, "of "+chargeID) || !strings.Contains(list, "capture") || !strings.Contains(list, "990.00 BRL") {
		t.Fatalf("the stuck list lacks the capture %s of %s for 990.00 BRL:\n%s", opID, chargeID, list)
	}
	if g := text("#groups"); !strings.Contains(g, "capture sent, outcome unknown") {
		t.Fatalf("the groups:\n%s", g)
	}
	shoot(ctx, t, "operators-capture-stuck")

	do("opening the capture from the list", chromedp.Click(`#stuck a[href="/admin/operations/`+opID+`"]`), chromedp.WaitVisible("#timeline"))
	page()
	if tl := text("#timeline"); !strings.Contains(tl, "inserted") || !strings.Contains(tl, "sent, no answer stored") {
		t.Fatalf("the capture's timeline:\n%s", tl)
	}
	if st := text("#status"); st != "pending" {
		t.Fatalf("the capture's status: %q", st)
	}
	shoot(ctx, t, "operators-capture-timeline")

	do("asking the acquirer", chromedp.Click("#lookup"), chromedp.WaitVisible("#acquirer-answer"))
	page()
	if a := text("#acquirer-answer"); !strings.Contains(a, "made this capture") {
		t.Fatalf("the acquirer's answer about the capture: %q", a)
	}
	for _, sel := range []string{"#status-succeeded", "#status-failed"} {
		if checked, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.querySelector("`+sel+`").checked`)); err != nil || checked {
			t.Fatalf("%s is preselected (%v)", sel, err)
		}
	}
	shoot(ctx, t, "operators-capture-look")

	const reason = "Acquirer support: captured 990.00, ticket 8841"
	do("reviewing failed, against the acquirer", chromedp.Click("#status-failed"), chromedp.SendKeys("#reason", reason),
		chromedp.Click(`#resolve-operation button[type="submit"]`), chromedp.WaitVisible("#confirm"))
	page()
	if w := text("#warning"); !strings.Contains(w, "succeeded") {
		t.Fatalf("the confirmation's warning: %q", w)
	}
	if c := text("#confirm"); !strings.Contains(c, "Force failed") {
		t.Fatalf("the confirm button against the acquirer: %q", c)
	}
	do("going back to the capture", chromedp.Navigate(e.admin.URL+"/admin/operations/"+opID), chromedp.WaitVisible("#lookup"),
		chromedp.Click("#lookup"), chromedp.WaitVisible("#resolve-operation"))
	do("reviewing succeeded", chromedp.Click("#status-succeeded"), chromedp.SendKeys("#reason", reason),
		chromedp.Click(`#resolve-operation button[type="submit"]`), chromedp.WaitVisible("#confirm"))
	page()
	if d := text("#decision"); d != "succeeded" {
		t.Fatalf("the confirmation shows %q", d)
	}
	shoot(ctx, t, "operators-capture-confirm")
	do("confirming", chromedp.Click("#confirm"), chromedp.WaitVisible("#timeline"))
	page()
	if st, cs := text("#status"), text("#charge-status"); st != "succeeded" || cs != "captured" {
		t.Fatalf("after the resolution: the capture %q, its charge %q", st, cs)
	}
	if tl := text("#timeline"); !strings.Contains(tl, "resolution by admin:alice: succeeded") || !strings.Contains(tl, reason) || !strings.Contains(tl, "settled") {
		t.Fatalf("the timeline after the resolution:\n%s", tl)
	}
	do("the audit trail", chromedp.Navigate(e.admin.URL+"/admin/audit"), chromedp.WaitVisible("#audit"))
	page()
	if a := text("#audit"); !strings.Contains(a, opID) || !strings.Contains(a, reason) {
		t.Fatalf("audit trail:\n%s", a)
	}
	do("the audit entry links the capture", chromedp.Click(`#audit a[href="/admin/operations/`+opID+`"]`), chromedp.WaitVisible("#timeline"))
	page()
	t.Logf("page widths in a 1280 px window: %v", widths)
}
