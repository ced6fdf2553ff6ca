package stripe_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer/stripe"
)

// listServer serves Stripe's list endpoints for PaymentIntents and Refunds
// over a fixed set of objects, as Stripe pages them: newest first, limit,
// starting_after, created[gte] and created[lt]; it records the queries.
type listServer struct {
	t       *testing.T
	mu      sync.Mutex
	queries []string
	pis     []map[string]any // newest first
	refunds []map[string]any
}

func (s *listServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if r.Method == http.MethodPost { // stripe-go sends list params in the query of a GET
		s.t.Errorf("%s %s: a list is a GET", r.Method, r.URL)
	}
	s.mu.Lock()
	s.queries = append(s.queries, r.URL.Path+"?"+r.URL.RawQuery)
	s.mu.Unlock()
	var objs []map[string]any
	switch r.URL.Path {
	case "/v1/payment_intents":
		objs = s.pis
	case "/v1/refunds":
		objs = s.refunds
		if q.Get("expand[0]") != "data.payment_intent" {
			s.t.Errorf("refunds listed without expanding their PaymentIntent: %s", r.URL.RawQuery)
		}
	default:
		http.NotFound(w, r)
		return
	}
	gte, err1 := strconv.ParseInt(q.Get("created[gte]"), 10, 64)
	lt, err2 := strconv.ParseInt(q.Get("created[lt]"), 10, 64)
	limit, err3 := strconv.Atoi(q.Get("limit"))
	if err1 != nil || err2 != nil || err3 != nil || limit < 1 || limit > 100 {
		http.Error(w, `{"error":{"type":"invalid_request_error","message":"bad list query"}}`, http.StatusBadRequest)
		return
	}
	var in []map[string]any
	for _, o := range objs {
		if c := o["created"].(int64); c >= gte && c < lt {
			in = append(in, o)
		}
	}
	if after := q.Get("starting_after"); after != "" {
		i := slices.IndexFunc(in, func(o map[string]any) bool { return o["id"] == after })
		if i < 0 {
			http.Error(w, `{"error":{"type":"invalid_request_error","message":"no such object"}}`, http.StatusBadRequest)
			return
		}
		in = in[i+1:]
	}
	more := len(in) > limit
	if more {
		in = in[:limit]
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "url": r.URL.Path, "has_more": more, "data": in})
}

// A period of 120 PaymentIntents and 20 Refunds, listed 7 at a time and
// sorted in runs of 13 (so through temporary files), comes out as every
// object of the period once, in reference order, mapped; objects outside
// the period are not asked for; the files are gone when the read is over.
func TestLedgerPagesAndSorts(t *testing.T) {
	t.Parallel()
	day := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	srv := &listServer{t: t}
	// Newest first, as Stripe lists; references in an order unlike creation.
	for i := 129; i >= 0; i-- {
		created := day.Add(time.Duration(i-5) * 10 * time.Minute).Unix() // 5 before the day
		ref := fmt.Sprintf("ch_%03d", (i*37)%130)
		status := "succeeded"
		if i%9 == 0 {
			status = "requires_payment_method"
		}
		srv.pis = append(srv.pis, map[string]any{
			"id": fmt.Sprintf("pi_%03d", i), "object": "payment_intent", "amount": 1000 + i, "currency": "brl", "status": status, "created": created,
			"metadata": map[string]string{"chargeonce_reference": ref, "merchant": "demo", "order_id": strconv.Itoa(i)},
		})
		if i%6 == 0 {
			srv.refunds = append(srv.refunds, map[string]any{
				"id": fmt.Sprintf("re_s%03d", i), "object": "refund", "amount": 100, "currency": "brl", "status": "succeeded", "created": created + 60,
				"metadata":       map[string]string{"chargeonce_reference": fmt.Sprintf("re_%03d", i)},
				"payment_intent": map[string]any{"id": fmt.Sprintf("pi_%03d", i), "object": "payment_intent", "metadata": map[string]string{"chargeonce_reference": ref, "merchant": "demo"}},
			})
		}
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	retries := int64(0)
	acq, err := stripe.New(stripe.Options{Key: "sk_test_123", APIBase: hs.URL, MaxNetworkRetries: &retries})
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	l := acq.Ledger(stripe.LedgerOptions{ListLimit: 7, Chunk: 13, TempDir: tmp})
	t.Cleanup(func() { _ = l.Close() })

	p := chargeonce.LedgerParams{From: day, To: day.Add(24 * time.Hour), Limit: 10}
	var got []chargeonce.LedgerEntry
	for pages := 0; ; pages++ {
		page, err := l.LedgerList(t.Context(), p)
		if err != nil {
			t.Fatalf("page %d: %v", pages, err)
		}
		got = append(got, page.Entries...)
		if pages == 0 {
			files, _ := filepath.Glob(filepath.Join(tmp, "*"))
			if len(files) < 2 {
				t.Errorf("after the first page: %d sorted runs on disk, want several (runs of 13)", len(files))
			}
		}
		if page.Next == "" {
			break
		}
		p.After = page.Next
	}
	// 125 PaymentIntents of the day (i = 5..129), and the refunds of theirs
	// (i%6 == 0 from 6 on, created a minute after).
	wantPIs, wantRefunds := 125, 0
	for i := 5; i < 130; i++ {
		if i%6 == 0 {
			wantRefunds++
		}
	}
	var pis, refunds int
	for i, e := range got {
		if i > 0 && strings.Compare(got[i-1].ChargeReference, e.ChargeReference) > 0 {
			t.Fatalf("entry %d (%s) after %s: not in reference order", i, e.ChargeReference, got[i-1].ChargeReference)
		}
		if e.CreatedAt.Before(day) {
			t.Errorf("entry %s created %s, before the period", e.ID, e.CreatedAt)
		}
		switch e.Kind {
		case chargeonce.LedgerCapture:
			pis++
			n, _ := strconv.Atoi(strings.TrimPrefix(e.ID, "pi_"))
			want := string(chargeonce.StatusCaptured)
			if n%9 == 0 {
				want = string(chargeonce.StatusDeclined)
			}
			if e.Reference != fmt.Sprintf("ch_%03d", (n*37)%130) || e.ChargeReference != e.Reference || e.AmountCents != int64(1000+n) ||
				e.Currency != "BRL" || e.Status != want || e.Merchant != "demo" || e.OrderID != int64(n) || e.MetaReference() != e.Reference {
				t.Errorf("PaymentIntent %s mapped to %+v", e.ID, e)
			}
		case chargeonce.LedgerRefund:
			refunds++
			n, _ := strconv.Atoi(strings.TrimPrefix(e.ID, "re_s"))
			if e.Reference != fmt.Sprintf("re_%03d", n) || e.ChargeReference != fmt.Sprintf("ch_%03d", (n*37)%130) || e.AmountCents != 100 || e.Status != "succeeded" || e.Merchant != "demo" {
				t.Errorf("Refund %s mapped to %+v", e.ID, e)
			}
		}
	}
	if pis != wantPIs || refunds != wantRefunds {
		t.Errorf("%d PaymentIntents and %d Refunds, want %d and %d", pis, refunds, wantPIs, wantRefunds)
	}
	srv.mu.Lock()
	queries := slices.Clone(srv.queries)
	srv.mu.Unlock()
	after := 0
	for _, q := range queries {
		if !strings.Contains(q, fmt.Sprintf("created[gte]=%d", day.Unix())) || !strings.Contains(q, fmt.Sprintf("created[lt]=%d", day.Add(24*time.Hour).Unix())) {
			t.Errorf("query %s does not ask for the period", q)
		}
		if strings.Contains(q, "starting_after=") {
			after++
		}
	}
	if want := (wantPIs+6)/7 + (wantRefunds+6)/7; len(queries) != want || after != want-2 {
		t.Errorf("%d list calls (%d with starting_after), want %d (%d): %q", len(queries), after, want, want-2, queries)
	}
	if files, _ := filepath.Glob(filepath.Join(tmp, "*")); len(files) != 0 {
		t.Errorf("the sorted runs outlived the read: %q", files)
	}
	// A page out of turn is refused, not answered from the wrong place.
	if _, err := l.LedgerList(t.Context(), chargeonce.LedgerParams{From: day, To: day.Add(24 * time.Hour), After: "page 3", Limit: 10}); chargeonce.ErrorCode(err) != chargeonce.EINVALID {
		t.Errorf("a cursor of a finished read: %v, want EINVALID", err)
	}
	if _, err := os.Stat(tmp); err != nil {
		t.Fatal(err)
	}
}

// TestLedgerAgainstStripeMock: the list requests the ledger makes (created
// range, limit, expand of the refunds' PaymentIntent and of the
// PaymentIntents' latest charge) are accepted by stripe-mock, which checks
// them against Stripe's OpenAPI description, and its fixture objects map
// to entries. stripe-mock is stateless: it answers
// one fixture page (has_more false) whatever the range, so pagination and
// the period's filter are shown by TestLedgerPagesAndSorts, not here.
func TestLedgerAgainstStripeMock(t *testing.T) {
	t.Parallel()
	base := startStripeMock(t)
	retries := int64(0)
	acq, err := stripe.New(stripe.Options{Key: "sk_test_123", APIBase: base, MaxNetworkRetries: &retries})
	if err != nil {
		t.Fatal(err)
	}
	l := acq.Ledger(stripe.LedgerOptions{})
	t.Cleanup(func() { _ = l.Close() })
	day := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	page, err := l.LedgerList(t.Context(), chargeonce.LedgerParams{From: day, To: day.Add(24 * time.Hour), Limit: 1000})
	if err != nil {
		t.Fatalf("stripe-mock refused the ledger's list requests: %v", err)
	}
	var kinds []chargeonce.LedgerKind
	for _, e := range page.Entries {
		kinds = append(kinds, e.Kind)
		if e.ID == "" || e.AmountCents <= 0 || e.Currency == "" || e.Status == "" || e.CreatedAt.IsZero() {
			t.Errorf("fixture entry mapped to %+v", e)
		}
	}
	if !slices.Contains(kinds, chargeonce.LedgerCapture) || !slices.Contains(kinds, chargeonce.LedgerRefund) || page.Next != "" {
		t.Errorf("entries of kinds %v, next %q; want stripe-mock's PaymentIntent and Refund fixtures on one page", kinds, page.Next)
	}
	t.Logf("stripe-mock fixtures: %+v", page.Entries)
}

// PaymentIntents with manual capture map to an authorization and what
// settled it: requires_capture is an authorization; succeeded adds its
// capture for amount_received (the amount captured, not the amount
// authorized); canceled after holding money (its latest charge succeeded)
// adds a void at canceled_at; canceled or declined before holding any is
// a declined capture, as with automatic capture. The list asks Stripe to
// expand each PaymentIntent's latest charge, which tells the two apart.
func TestLedgerMapsManualCapture(t *testing.T) {
	t.Parallel()
	day := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	at := day.Add(time.Hour).Unix()
	pi := func(id, ref, status string, received int64, charge map[string]any) map[string]any {
		o := map[string]any{
			"id": id, "object": "payment_intent", "amount": 1000, "amount_received": received, "currency": "brl",
			"status": status, "created": at, "capture_method": "manual",
			"metadata": map[string]string{"chargeonce_reference": ref, "merchant": "demo", "order_id": "7"},
		}
		if charge != nil {
			o["latest_charge"] = charge
		}
		if status == "canceled" {
			o["canceled_at"] = at + 120
		}
		return o
	}
	held := func(id string) map[string]any {
		return map[string]any{"id": id, "object": "charge", "status": "succeeded", "captured": false}
	}
	srv := &listServer{t: t, pis: []map[string]any{
		pi("pi_open", "ch_open", "requires_capture", 0, held("ch_s_open")),
		pi("pi_cap", "ch_cap", "succeeded", 600, map[string]any{"id": "ch_s_cap", "object": "charge", "status": "succeeded", "captured": true}),
		pi("pi_void", "ch_void", "canceled", 0, held("ch_s_void")),
		pi("pi_decl", "ch_decl", "canceled", 0, map[string]any{"id": "ch_s_decl", "object": "charge", "status": "failed"}),
		pi("pi_rpm", "ch_rpm", "requires_payment_method", 0, nil),
	}}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	retries := int64(0)
	acq, err := stripe.New(stripe.Options{Key: "sk_test_123", APIBase: hs.URL, MaxNetworkRetries: &retries})
	if err != nil {
		t.Fatal(err)
	}
	l := acq.Ledger(stripe.LedgerOptions{})
	t.Cleanup(func() { _ = l.Close() })
	page, err := l.LedgerList(t.Context(), chargeonce.LedgerParams{From: day, To: day.Add(24 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range page.Entries {
		got = append(got, fmt.Sprintf("%s %s %s/%s %d %s %s", e.ID, e.Kind, e.Reference, e.ChargeReference, e.AmountCents, e.Status, e.CreatedAt.Format("15:04:05")))
	}
	want := []string{
		"pi_cap authorization ch_cap/ch_cap 1000 authorized 01:00:00",
		"ch_s_cap manual_capture /ch_cap 600 succeeded 01:00:00",
		"pi_decl capture ch_decl/ch_decl 1000 declined 01:00:00",
		"pi_open authorization ch_open/ch_open 1000 authorized 01:00:00",
		"pi_rpm capture ch_rpm/ch_rpm 1000 declined 01:00:00",
		"pi_void authorization ch_void/ch_void 1000 authorized 01:00:00",
		"pi_void void /ch_void 1000 succeeded 01:02:00",
	}
	if !slices.Equal(got, want) {
		t.Errorf("ledger\n%q\nwant\n%q", got, want)
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	for _, q := range srv.queries {
		if strings.HasPrefix(q, "/v1/payment_intents?") && !strings.Contains(q, "expand[0]=data.latest_charge") {
			t.Errorf("PaymentIntents listed without expanding their latest charge: %s", q)
		}
	}
}
