package admin_test

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/admin"
	"github.com/chargeonce/chargeonce/internal/apitest"
)

// windowOnly is an acquirer's finality without a fence: a "no" on a
// reference it never saw waits out the window.
type windowOnly time.Duration

func (w windowOnly) AcceptanceWindow() time.Duration { return time.Duration(w) }

// withFinality serves a second admin API over e's store and acquirer, with
// f as the acquirer's finality.
func (e *env) withFinality(t *testing.T, f chargeonce.Finality) {
	t.Helper()
	srv, err := admin.New(admin.Config{
		Store: e.store, Acquirer: e.acq, Finality: f, Keys: adminKeys(t), Lease: testOptions.Lease,
		AcquirerTimeout: testOptions.AcquirerTimeout, Logger: newLogger(e.logs),
	})
	if err != nil {
		t.Fatal(err)
	}
	e.admin = httptest.NewServer(srv)
	t.Cleanup(e.admin.Close)
}

// captured charges amount with tok_ok and returns the charge's id.
func (e *env) captured(t *testing.T, key string, amount int64) string {
	t.Helper()
	r := apitest.Charge(t, e.api.URL, key, fmt.Sprintf(`{"order_id":%d,"amount_cents":%d,"payment_token":"tok_ok"}`, e.orders.Add(1), amount))
	var ch struct{ ID string }
	if err := json.Unmarshal(r.Body, &ch); err != nil || r.Status != 201 {
		t.Fatalf("charge: %d %s", r.Status, r.Body)
	}
	return ch.ID
}

// refund asks the merchant API to refund amount of chargeID with key.
func (e *env) refund(t *testing.T, chargeID, key string, amount int64) (status int, refundID, refundStatus string) {
	t.Helper()
	r, err := apitest.Do(t, nil, "POST", e.api.URL+"/v1/charges/"+chargeID+"/refunds", fmt.Appendf(nil, `{"amount_cents":%d}`, amount), map[string]string{"Idempotency-Key": key})
	var rf struct{ ID, Status string }
	if err != nil || json.Unmarshal(r.Body, &rf) != nil {
		t.Fatalf("refund of %s: %d %s %v", chargeID, r.Status, r.Body, err)
	}
	return r.Status, rf.ID, rf.Status
}

// ourRefunded is what our books say was given back of chargeID: the sum
// of its refunds that succeeded.
func (e *env) ourRefunded(t *testing.T, chargeID string) int64 {
	t.Helper()
	r, err := apitest.Do(t, nil, "GET", e.api.URL+"/v1/refunds?charge_id="+chargeID, nil, nil)
	var page struct {
		Data []struct {
			AmountCents int64 `json:"amount_cents"`
			Status      string
		}
	}
	if err != nil || r.Status != 200 || json.Unmarshal(r.Body, &page) != nil {
		t.Fatalf("listing the refunds of %s: %d %s %v", chargeID, r.Status, r.Body, err)
	}
	var sum int64
	for _, rf := range page.Data {
		if rf.Status == string(chargeonce.RefundSucceeded) {
			sum += rf.AmountCents
		}
	}
	return sum
}

// TestFailedRefundOverAHeldRequestIsNeverPaidTwice (issue 47, item 1): a
// refund whose request a proxy holds past the attempt's timeout is
// pending; the acquirer has not seen it. An operator who resolves it
// failed must not be believed while the held request may still land: with
// a fencing acquirer the reference is fenced first, so the late request
// is refused; with one that only states a window the resolution is 409
// acquirer-unsure with Retry-After, and once the request landed the
// acquirer's refund binds. Either way the merchant, told the truth,
// refunds once more at most, and the acquirer's ledger matches our books
// to the cent. On the old code the resolution settled failed and the held
// request refunded too: 600 at the acquirer, 300 in our books.
func TestFailedRefundOverAHeldRequestIsNeverPaidTwice(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"postgres", "sqlite"} {
		for _, fence := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/fence=%t", kind, fence), func(t *testing.T) {
				t.Parallel()
				e := setup(t, kind)
				if !fence {
					e.withFinality(t, windowOnly(time.Hour))
				}
				chargeID := e.captured(t, "charge-held-refund", 1000)
				e.acq.hold.Store(int64(2500 * time.Millisecond))
				st, refundID, status := e.refund(t, chargeID, "held-refund", 300)
				e.acq.hold.Store(0)
				if st != 202 || status != "pending" {
					t.Fatalf("a refund held past the attempt's timeout: %d %s, want 202 pending", st, status)
				}
				path := "/admin/v1/refunds/" + refundID + "/resolve"
				failed := admin.RefundResolveRequest{Status: chargeonce.RefundFailed, Reason: "the acquirer never saw it"}
				st, b := e.call(t, "POST", path, aliceKey, failed)
				if fence {
					if st != 200 || !strings.Contains(string(b), "fenced") {
						t.Fatalf("resolving failed with a fencing acquirer: %d %s, want 200 quoting the fence", st, b)
					}
				} else {
					if st != 409 || problemType(b) != chargeonce.EUNSURE || !strings.Contains(string(b), "acceptance window") {
						t.Fatalf("resolving failed within the acceptance window: %d %s, want 409 %s", st, b, chargeonce.EUNSURE)
					}
				}
				e.acq.held.Wait() // the held request lands
				if fence {
					if n := e.sim.Stats().LateRequests; n != 1 {
						t.Fatalf("requests refused under the fence: %d, want 1", n)
					}
				} else {
					// It landed and refunded: now "failed" is ruled out, even
					// forced, and the acquirer's answer settles it.
					failed.Force = true
					if st, b := e.call(t, "POST", path, aliceKey, failed); st != 409 || problemType(b) != chargeonce.EDISAGREES || !strings.Contains(string(b), "whatever force says") {
						t.Fatalf("forcing failed over a refund that landed: %d %s, want 409 %s", st, b, chargeonce.EDISAGREES)
					}
					if st, b := e.call(t, "POST", path, aliceKey, admin.RefundResolveRequest{Status: chargeonce.RefundSucceeded, Reason: "it landed"}); st != 200 {
						t.Fatalf("resolving as the acquirer says: %d %s", st, b)
					}
				}
				// The merchant, told what the books say, refunds what is
				// left to give back of the 300 once more.
				if e.ourRefunded(t, chargeID) == 0 {
					if st, _, status := e.refund(t, chargeID, "held-refund-again", 300); st != 201 || status != "succeeded" {
						t.Fatalf("the merchant's second refund: %d %s", st, status)
					}
				}
				ours, theirs := e.ourRefunded(t, chargeID), e.sim.RefundedCents(chargeID)
				if ours != 300 || theirs != 300 {
					t.Fatalf("refunded: %d in our books, %d at the acquirer; want 300 and 300", ours, theirs)
				}
			})
		}
	}
}

// TestFailedCaptureOverAHeldRequestLeavesNoChargeStuck (issue 47, item 2):
// a manual capture held past the attempt's timeout, resolved failed, must
// not land afterwards: the fence refuses it, the charge stays authorized
// at both ends, and the merchant can cancel it. On the old code the
// capture landed after the resolution: the acquirer captured 1000 while
// the charge stayed authorized here, and capture and cancel answered 402.
func TestFailedCaptureOverAHeldRequestLeavesNoChargeStuck(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"postgres", "sqlite"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := setup(t, kind)
			r := apitest.Charge(t, e.api.URL, "auth-held", fmt.Sprintf(`{"order_id":%d,"amount_cents":1000,"payment_token":"tok_ok","capture_method":"manual"}`, e.orders.Add(1)))
			var ch struct{ ID, Status string }
			if err := json.Unmarshal(r.Body, &ch); err != nil || r.Status != 201 || ch.Status != "authorized" {
				t.Fatalf("manual charge: %d %s", r.Status, r.Body)
			}
			e.acq.hold.Store(int64(2500 * time.Millisecond))
			rr := e.operate(t, chargeonce.KindCapture, ch.ID, "held-capture", `{}`)
			e.acq.hold.Store(0)
			if rr.Status != 202 {
				t.Fatalf("a capture held past the attempt's timeout: %d %s, want 202", rr.Status, rr.Body)
			}
			rec, err := e.store.KeyGet(t.Context(), "demo", "held-capture")
			if err != nil || rec.Operation == nil {
				t.Fatalf("the capture's record: %+v, %v", rec, err)
			}
			st, b := e.call(t, "POST", "/admin/v1/operations/"+rec.Operation.ID+"/resolve", aliceKey,
				admin.OperationResolveRequest{Status: chargeonce.OperationFailed, Reason: "the acquirer never saw it"})
			if st != 200 || !strings.Contains(string(b), "fenced") {
				t.Fatalf("resolving the held capture failed: %d %s, want 200 quoting the fence", st, b)
			}
			e.acq.held.Wait()
			if captured, _ := e.sim.Authorization(ch.ID); captured != 0 {
				t.Fatalf("the acquirer captured %d after the capture was resolved failed", captured)
			}
			if r := e.operate(t, chargeonce.KindCancel, ch.ID, "cancel-after", `{}`); r.Status != 200 || !strings.Contains(string(r.Body), `"status":"canceled"`) {
				t.Fatalf("canceling the authorization afterwards: %d %s", r.Status, r.Body)
			}
			if captured, voided := e.sim.Authorization(ch.ID); captured != 0 || !voided {
				t.Fatalf("at the acquirer: captured %d, voided %t; want 0 and voided", captured, voided)
			}
		})
	}
}

// TestSucceededOnNothingNeedsForce (issue 47, item 3): a refund or a
// capture whose request never reached the acquirer (it was down) is not
// resolved succeeded on the operator's word alone: the acquirer holds
// nothing, which contradicts money moving, so it is 409
// acquirer-disagrees unless forced, and the forced one is audited as
// forced. On the old code both answered 200 without force.
func TestSucceededOnNothingNeedsForce(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"postgres", "sqlite"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := setup(t, kind)
			chargeID := e.captured(t, "charge-nothing", 1000)
			e.acq.down.Store(true)
			st, refundID, _ := e.refund(t, chargeID, "refund-nothing", 300)
			r := apitest.Charge(t, e.api.URL, "auth-nothing", fmt.Sprintf(`{"order_id":%d,"amount_cents":700,"payment_token":"tok_ok","capture_method":"manual"}`, e.orders.Add(1)))
			e.acq.down.Store(false)
			if st != 202 {
				t.Fatalf("a refund with the acquirer down: %d, want 202", st)
			}
			var auth struct{ ID string }
			_ = json.Unmarshal(r.Body, &auth)
			if r.Status != 202 {
				t.Fatalf("an authorization with the acquirer down: %d %s, want 202", r.Status, r.Body)
			}
			for _, c := range []struct {
				path string
				q    func(force bool) any
			}{
				{"/admin/v1/refunds/" + refundID + "/resolve", func(force bool) any {
					return admin.RefundResolveRequest{Status: chargeonce.RefundSucceeded, Reason: "support says it went through", Force: force}
				}},
				{"/admin/v1/charges/" + auth.ID + "/resolve", func(force bool) any {
					return admin.ResolveRequest{Status: chargeonce.StatusAuthorized, Reason: "support says it is held", Force: force}
				}},
			} {
				st, b := e.call(t, "POST", c.path, aliceKey, c.q(false))
				if st != 409 || problemType(b) != chargeonce.EDISAGREES {
					t.Fatalf("%s as money moved over a reference the acquirer never saw: %d %s, want 409 %s", c.path, st, b, chargeonce.EDISAGREES)
				}
				st, b = e.call(t, "POST", c.path, aliceKey, c.q(true))
				var res struct{ Audit admin.EntryJSON }
				if st != 200 || json.Unmarshal(b, &res) != nil || !res.Audit.Forced {
					t.Fatalf("%s forced: %d %s, want 200 audited as forced", c.path, st, b)
				}
			}
		})
	}
}

// TestUnsureRefusalSaysWhenToComeBack: within the acceptance window, a
// "no" on a reference the acquirer never saw is refused with Retry-After
// the window's rest, and the refusal does not start the window again: the
// next resolution measures from our last request, not from the refused
// look.
func TestUnsureRefusalSaysWhenToComeBack(t *testing.T) {
	t.Parallel()
	e := setup(t, "sqlite")
	e.withFinality(t, windowOnly(time.Hour))
	id, _ := e.stuck(t, "unsure-retry-after")
	path := "/admin/v1/charges/" + id + "/resolve"
	var first int
	for i := range 2 {
		req := httptest.NewRequest("POST", e.admin.URL+path, strings.NewReader(`{"status":"declined","reason":"never arrived"}`))
		req.RequestURI = ""
		req.Header.Set("Authorization", "Bearer "+aliceKey)
		resp, err := e.admin.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		ra, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
		// The charge is backed off for up to an hour (with jitter) after our
		// last request: the window of an hour runs from the back-off's end.
		if resp.StatusCode != 409 || ra <= 3600 || ra > 7200 {
			t.Fatalf("resolution %d within the window: %d, Retry-After %q; want 409 with the window and the back-off's rest", i, resp.StatusCode, resp.Header.Get("Retry-After"))
		}
		if i == 0 {
			first = ra
		} else if ra > first {
			t.Fatalf("the second refusal's Retry-After %d is later than the first's %d: the refused look restarted the window", ra, first)
		}
	}
	// The console's refusal says why, and what forcing would risk.
	st, page := e.console(t).do(t, "/admin/charges/"+id+"/resolve", url.Values{"status": {"declined"}, "reason": {"never arrived"}, "confirm": {"1"}})
	if st != 409 || !strings.Contains(page, "acceptance window") || !strings.Contains(page, `id="force-risk"`) || !strings.Contains(page, "a refund paid twice") {
		t.Fatalf("the console's refused resolution: %d, want 409 naming the window and what forcing risks:\n%s", st, page)
	}
}
