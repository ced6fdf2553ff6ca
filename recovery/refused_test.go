package recovery_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/recovery"
)

// TestRefusedCaptureIsSettledDeclined: an acquirer that definitely refuses
// a capture (a 4xx answer: it moved no money and never will for this
// request) must not have the capture re-driven forever. Recovery settles it
// as declined with decline_code acquirer_rejected, and retries replay that.
// A 5xx, by contrast, stays an unknown outcome.
func TestRefusedCaptureIsSettledDeclined(t *testing.T) {
	t.Parallel()
	var posts atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/problem+json")
		switch {
		case r.Method == "POST" && strings.Contains(r.URL.Path, "captures"):
			posts.Add(1)
			w.WriteHeader(http.StatusUnprocessableEntity)
			_ = json.NewEncoder(w).Encode(map[string]any{"type": "about:blank", "title": "Unprocessable", "status": 422, "detail": "merchant not enabled for this currency"})
		default:
			w.WriteHeader(http.StatusNotFound)
			// The simulator API's own "no capture under this reference".
			_ = json.NewEncoder(w).Encode(map[string]any{"type": chargeonce.ProblemTypeBase + chargeonce.ENOTFOUND, "title": "Not found", "status": 404})
		}
	}))
	t.Cleanup(srv.Close)
	e := setup(t, nil, engine.Options{})
	eng := engine.New(e.store, acquirer.NewClient(srv.URL, nil), e.eng.Options())
	req := request("tok_ok")

	resp, err := eng.Charge(t.Context(), "demo", "refused", req)
	if err != nil {
		t.Fatalf("first attempt: %v", err)
	}
	if resp.Status != 402 {
		t.Fatalf("first attempt answered %d %s; want 402 acquirer_rejected", resp.Status, resp.Body)
	}
	rec := get(t, e.store, "refused")
	if rec.State != chargeonce.KeyCompleted || rec.Charge.Status != chargeonce.StatusDeclined || rec.Charge.DeclineCode != "acquirer_rejected" {
		t.Fatalf("record %s, charge %s/%q; want completed, declined, acquirer_rejected", rec.State, rec.Charge.Status, rec.Charge.DeclineCode)
	}
	if !strings.Contains(string(resp.Body), `"decline_code":"acquirer_rejected"`) {
		t.Fatalf("402 body %s lacks the decline code", resp.Body)
	}

	// An orphan (its attempt died) is settled the same way by recovery.
	o := request("tok_ok")
	orphan(t, e.store, "refused-orphan", o)
	res, err := recovery.NewRescuer(e.store, eng, recovery.RescuerOptions{}).RunOnce(t.Context())
	if err != nil || res.Settled != 1 || res.Deferred != 0 {
		t.Fatalf("RunOnce = %+v, %v; want the refused capture settled", res, err)
	}
	replay, err := eng.Charge(t.Context(), "demo", "refused-orphan", o)
	if err != nil || replay.Status != 402 || !replay.Replayed {
		t.Fatalf("retry of the refused orphan: %+v, %v; want the stored 402 replayed", replay, err)
	}
	if n := posts.Load(); n != 2 {
		t.Fatalf("the acquirer got %d capture requests, want 2 (one per intent, never re-driven)", n)
	}
}
