package admin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/chargeonce/chargeonce/internal/apitest"
)

// screenshots, when set, is where TestConsoleInBrowser saves a PNG of each
// page it visits: `go test ./admin -run TestConsoleInBrowser -screenshots
// ../docs` refreshes the pictures docs/operators.md shows. Without it they
// go to a temporary directory (and are still checked to be PNGs).
var screenshots = flag.String("screenshots", "", "save the console's screenshots in this directory (../docs refreshes the docs' pictures)")

// tab drives a test's browser tab: do runs actions and fails the test,
// saying what it was doing, when they fail; text reads an element's text.
type tab struct {
	t   *testing.T
	ctx context.Context
}

func (b tab) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	if err := chromedp.Do(b.ctx, actions...); err != nil {
		b.t.Fatalf("%s: %v", what, err)
	}
}

func (b tab) text(sel string) string {
	b.t.Helper()
	s, err := chromedp.Run(b.ctx, chromedp.Text(sel))
	if err != nil {
		b.t.Fatalf("reading %s: %v", sel, err)
	}
	return s
}

// browser starts Debian's headless Chromium with a fresh profile. No
// browser is a failure, never a skip: .ci/run installs it.
func browser(t *testing.T) context.Context {
	t.Helper()
	path := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		t.Fatal("no Chromium to drive: install Debian's chromium (apt-get install -y chromium); .ci/run does")
	}
	var out apitest.Buffer
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
		chromedp.CombinedOutput(&out),
	)
	ctx, cancelCtx := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancelCtx()
		cancelAlloc()
	})
	// Start the browser now, so that a browser that cannot start fails
	// here, saying why. The first action runs on ctx itself: the browser
	// lives as long as the context of that first action.
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("starting %s: %v\n%s", path, err, out.String())
	}
	return ctx
}

// shoot saves a PNG of the whole page as name.png.
func shoot(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	dir := *screenshots
	if dir == "" {
		dir = t.TempDir()
	}
	b, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if _, err := png.Decode(bytes.NewReader(b)); err != nil {
		t.Fatalf("screenshot %s is no PNG: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestConsoleInBrowser drives the console in headless Chromium as an
// operator would: sign in with an admin key, find the stuck charge in the
// list and by its idempotency key, open its timeline, resolve it through
// the confirmation step, read the audit trail; then the merchant's retry
// replays the resolved answer. No page and no URL ever holds the admin key
// or the idempotency key.
func TestConsoleInBrowser(t *testing.T) {
	t.Parallel()
	e := setup(t, "postgres")
	const key = "order-7731-attempt-secretish"
	id, body := e.stuck(t, key)
	ctx := browser(t)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()

	do, text := tab{t, ctx}.do, tab{t, ctx}.text
	var pages []string
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
		// Every page fits the 1280 px window: nothing to scroll sideways
		// for (seen: 1,439–1,453 px, which cut off "Recovery tries next").
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
		pages = append(pages, loc)
	}

	// Signing in: the list needs a session.
	do("opening the console", chromedp.Navigate(e.admin.URL+"/admin/"), chromedp.WaitVisible("#key"))
	page()
	shoot(ctx, t, "operators-login")
	do("signing in with a merchant's key", chromedp.SendKeys("#key", apitest.APIKey), chromedp.Submit("#key"), chromedp.WaitVisible(".error"))
	if msg := text(".error"); !strings.Contains(msg, "not an admin key") {
		t.Fatalf("a merchant's key at sign-in: %q", msg)
	}
	do("signing in", chromedp.SendKeys("#key", aliceKey), chromedp.Submit("#key"), chromedp.WaitVisible("#stuck"))
	page()
	if list := text("#stuck"); !strings.Contains(list, id) || !strings.Contains(list, "could not be reached") {
		t.Fatalf("the stuck list lacks %s and its last error:\n%s", id, list)
	}
	shoot(ctx, t, "operators-stuck")

	// Search by idempotency key: posted, looked up, never shown.
	do("searching by idempotency key",
		chromedp.SendKeys(`form.search input[name="merchant"]`, "demo"),
		chromedp.SendKeys(`form.search input[name="idempotency_key"]`, key),
		chromedp.Submit(`form.search input[name="merchant"]`),
		chromedp.WaitVisible("#timeline"))
	page()
	if loc := pages[len(pages)-1]; !strings.HasSuffix(loc, "/admin/charges/"+id) {
		t.Fatalf("the search by key landed on %s, want the charge %s", loc, id)
	}

	// The timeline, from the list.
	do("opening the timeline from the list", chromedp.Navigate(e.admin.URL+"/admin/"), chromedp.WaitVisible("#stuck"),
		chromedp.Click(`#stuck a[href="/admin/charges/`+id+`"]`), chromedp.WaitVisible("#timeline"))
	page()
	if tl := text("#timeline"); !strings.Contains(tl, "inserted") || !strings.Contains(tl, "capture") || !strings.Contains(tl, "connection refused") {
		t.Fatalf("timeline:\n%s", tl)
	}
	if st := text("#status"); st != "processing" {
		t.Fatalf("status before the resolution: %q", st)
	}
	shoot(ctx, t, "operators-timeline")

	// Look before choosing: the acquirer is asked first, and its answer is
	// on the page in plain words; no outcome is preselected.
	do("asking the acquirer", chromedp.Click("#lookup"), chromedp.WaitVisible("#acquirer-answer"))
	page()
	if a := text("#acquirer-answer"); !strings.Contains(a, "never saw") {
		t.Fatalf("the acquirer's answer: %q, want that it never saw the charge", a)
	}
	for _, sel := range []string{"#status-captured", "#status-declined"} {
		if checked, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.querySelector("`+sel+`").checked`)); err != nil || checked {
			t.Fatalf("%s is preselected (%v)", sel, err)
		}
	}
	shoot(ctx, t, "operators-look")

	// Resolve: review, then confirm. Captured while the acquirer never saw
	// the charge is the case the page warns about loudest.
	const reason = "Acquirer support confirmed the capture, ticket 4411"
	do("reviewing the resolution", chromedp.Click("#status-captured"), chromedp.SendKeys("#reason", reason),
		chromedp.Click(`#resolve button[type="submit"]`), chromedp.WaitVisible("#confirm"))
	page()
	if d := text("#decision"); d != "captured" {
		t.Fatalf("the confirmation shows %q, want captured", d)
	}
	if w := text("#warning"); !strings.Contains(w, "never saw") || !strings.Contains(w, "no money moved") {
		t.Fatalf("the confirmation's warning: %q", w)
	}
	shoot(ctx, t, "operators-confirm")
	do("confirming", chromedp.Click("#confirm"), chromedp.WaitVisible("#timeline"))
	page()
	if st := text("#status"); st != "captured" {
		t.Fatalf("status after the resolution: %q", st)
	}
	if tl := text("#timeline"); !strings.Contains(tl, "resolution by admin:alice: captured") || !strings.Contains(tl, reason) || !strings.Contains(tl, "settled") {
		t.Fatalf("timeline after the resolution:\n%s", tl)
	}
	shoot(ctx, t, "operators-resolved")

	do("reading the audit trail", chromedp.Click(`nav a[href="/admin/audit"]`), chromedp.WaitVisible("#audit"))
	page()
	if a := text("#audit"); !strings.Contains(a, "admin:alice") || !strings.Contains(a, reason) || !strings.Contains(a, id) {
		t.Fatalf("audit trail:\n%s", a)
	}
	shoot(ctx, t, "operators-audit")
	do("the stuck list is empty", chromedp.Navigate(e.admin.URL+"/admin/"), chromedp.WaitVisible(".empty"))

	// The merchant's retry replays what the operator decided.
	r := apitest.Charge(t, e.api.URL, key, body)
	var ch struct{ ID, Status string }
	if err := json.Unmarshal(r.Body, &ch); err != nil || r.Status != 201 || r.Header.Get("Idempotent-Replayed") != "true" || ch.ID != id || ch.Status != "captured" {
		t.Fatalf("the merchant's retry: %d %s %v", r.Status, r.Body, r.Header)
	}
	if logs := e.logs.String(); strings.Contains(logs, aliceKey) || strings.Contains(logs, key) {
		t.Fatal("a secret reached the admin log")
	}
	// A charge in yen: ¥1,000 is amount_cents 1000, shown "1,000 JPY".
	e.acq.down.Store(true)
	jr := apitest.Charge(t, e.api.URL, "order-7732-yen", fmt.Sprintf(`{"order_id":%d,"amount_cents":1000,"currency":"JPY","payment_token":"tok_ok"}`, e.orders.Add(1)))
	e.acq.down.Store(false)
	var jch struct{ ID string }
	if err := json.Unmarshal(jr.Body, &jch); err != nil || jr.Status != 202 {
		t.Fatalf("the yen charge: %d %s", jr.Status, jr.Body)
	}
	do("opening the yen charge", chromedp.Navigate(e.admin.URL+"/admin/charges/"+jch.ID), chromedp.WaitVisible("#timeline"))
	page()
	if facts := text("dl.facts"); !strings.Contains(facts, "1,000 JPY") {
		t.Fatalf("the yen charge's facts:\n%s", facts)
	}
	shoot(ctx, t, "operators-jpy")
	do("the list with the yen charge", chromedp.Navigate(e.admin.URL+"/admin/"), chromedp.WaitVisible("#stuck"))
	page()
	if list := text("#stuck"); !strings.Contains(list, "1,000 JPY") {
		t.Fatalf("the stuck list:\n%s", list)
	}
	// An outage: more charges stuck, for two causes; the list groups them.
	for i := range 3 {
		apitest.Charge(t, e.api.URL, fmt.Sprintf("order-lost-%d", i), fmt.Sprintf(`{"order_id":%d,"amount_cents":%d,"payment_token":"tok_fail_after"}`, e.orders.Add(1), 12500+i*1000))
	}
	e.acq.down.Store(true)
	apitest.Charge(t, e.api.URL, "order-7733-yen", fmt.Sprintf(`{"order_id":%d,"amount_cents":250000,"currency":"JPY","payment_token":"tok_ok"}`, e.orders.Add(1)))
	e.acq.down.Store(false)
	do("the grouped list", chromedp.Navigate(e.admin.URL+"/admin/"), chromedp.WaitVisible("#groups"))
	page()
	if g := text("#groups"); !strings.Contains(g, "could not be reached") || !strings.Contains(g, "251,000 JPY") {
		t.Fatalf("the groups:\n%s", g)
	}
	shoot(ctx, t, "operators-groups")

	// A refund whose answer was lost: listed with its charge, resolved
	// from the charge's page after the acquirer is asked.
	refundCharge, refundID := e.stuckRefund(t, "refund-7734-secretish")
	do("the list with the refund", chromedp.Navigate(e.admin.URL+"/admin/"), chromedp.WaitVisible("#stuck"))
	page()
	if list := text("#stuck"); !strings.Contains(list, refundID) || !strings.Contains(list, "of "+refundCharge) {
		t.Fatalf("the stuck list lacks the refund %s of %s:\n%s", refundID, refundCharge, list)
	}
	do("opening the refund's charge from the list", chromedp.Click(`#stuck a[href="/admin/charges/`+refundCharge+`#`+refundID+`"]`), chromedp.WaitVisible("#refunds"))
	page()
	if rs := text("#refunds"); !strings.Contains(rs, refundID) || !strings.Contains(rs, "pending") {
		t.Fatalf("the charge's refunds:\n%s", rs)
	}
	do("asking the acquirer about the refund", chromedp.Click(".refund-lookup"), chromedp.WaitVisible("#acquirer-answer"))
	page()
	if a := text("#acquirer-answer"); !strings.Contains(a, "refunded") {
		t.Fatalf("the acquirer's answer about the refund: %q", a)
	}
	for _, sel := range []string{"#status-succeeded", "#status-failed", "#status-canceled"} {
		if checked, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.querySelector("`+sel+`").checked`)); err != nil || checked {
			t.Fatalf("%s is preselected (%v)", sel, err)
		}
	}
	shoot(ctx, t, "operators-refund")
	const refundReason = "Acquirer support: the refund went out, ticket 4412"
	do("reviewing the refund's resolution", chromedp.Click("#status-succeeded"), chromedp.SendKeys("#reason", refundReason),
		chromedp.Click(`#resolve-refund button[type="submit"]`), chromedp.WaitVisible("#confirm"))
	page()
	if d := text("#decision"); d != "succeeded" {
		t.Fatalf("the refund's confirmation shows %q", d)
	}
	do("confirming the refund", chromedp.Click("#confirm"), chromedp.WaitVisible("#refunds"))
	page()
	if rs := text("#refunds"); !strings.Contains(rs, "succeeded") {
		t.Fatalf("the charge's refunds after the resolution:\n%s", rs)
	}
	do("the audit trail with the refund", chromedp.Navigate(e.admin.URL+"/admin/audit"), chromedp.WaitVisible("#audit"))
	page()
	if a := text("#audit"); !strings.Contains(a, refundID) || !strings.Contains(a, refundReason) {
		t.Fatalf("audit trail:\n%s", a)
	}
	t.Logf("visited %d pages in Chromium: %s; their widths in a 1280 px window: %v", len(pages), strings.Join(pages, " "), widths)
}
