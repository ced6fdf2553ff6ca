package admin_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestConsoleAuthorizationInBrowser drives the console in headless
// Chromium for a manual-capture charge whose authorization's answer was
// lost (issue 35): asked first, the acquirer's answer says it authorized
// the charge; the resolve form offers authorized and declined, not
// captured, none preselected; the confirmation settles it authorized
// without a warning, and its page shows it so.
func TestConsoleAuthorizationInBrowser(t *testing.T) {
	t.Parallel()
	e := setup(t, "postgres")
	id, _ := e.stuckAuthorization(t, "auth-9911-secretish")
	ctx := browser(t)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()

	do, text := tab{t, ctx}.do, tab{t, ctx}.text
	count := func(sel string) int {
		t.Helper()
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("`+sel+`").length`))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	do("signing in", chromedp.Navigate(e.admin.URL+"/admin/"), chromedp.WaitVisible("#key"),
		chromedp.SendKeys("#key", aliceKey), chromedp.Submit("#key"), chromedp.WaitVisible("#stuck"))
	do("opening the charge", chromedp.Click(`#stuck a[href="/admin/charges/`+id+`"]`), chromedp.WaitVisible("#timeline"))
	do("asking the acquirer", chromedp.Click("#lookup"), chromedp.WaitVisible("#acquirer-answer"))
	if a := text("#acquirer-answer"); !strings.Contains(a, "authorized this charge") {
		t.Fatalf("the acquirer's answer: %q, want that it authorized the charge", a)
	}
	if m := text("#capture-method"); !strings.Contains(m, "manual") {
		t.Fatalf("the look page's capture method: %q", m)
	}
	if n := count("#status-captured"); n != 0 {
		t.Fatal("the form offers captured for a manual-capture charge")
	}
	for _, sel := range []string{"#status-authorized", "#status-declined"} {
		if checked, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.querySelector("`+sel+`").checked`)); err != nil || checked {
			t.Fatalf("%s is missing or preselected (%v)", sel, err)
		}
	}

	const reason = "Acquirer support: the authorization holds, ticket 9911"
	do("reviewing the resolution", chromedp.Click("#status-authorized"), chromedp.SendKeys("#reason", reason),
		chromedp.Click(`#resolve button[type="submit"]`), chromedp.WaitVisible("#confirm"))
	if d := text("#decision"); d != "authorized" {
		t.Fatalf("the confirmation shows %q, want authorized", d)
	}
	if n := count("#warning"); n != 0 {
		t.Fatalf("the confirmation warns: %q, though the acquirer agrees", text("#warning"))
	}
	if c := text("#confirm"); !strings.Contains(c, "settle as authorized") {
		t.Fatalf("the confirm button says %q", c)
	}
	do("confirming", chromedp.Click("#confirm"), chromedp.WaitVisible("#timeline"))
	if st := text("#status"); st != "authorized" {
		t.Fatalf("status after the resolution: %q", st)
	}
	if tl := text("#timeline"); !strings.Contains(tl, "resolution by admin:alice: authorized") || !strings.Contains(tl, reason) {
		t.Fatalf("timeline after the resolution:\n%s", tl)
	}
}
