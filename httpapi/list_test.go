package httpapi_test

import (
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/internal/apitest"
)

// chargeList is the list object of GET /v1/charges.
type chargeList struct {
	Object  string `json:"object"`
	URL     string `json:"url"`
	HasMore *bool  `json:"has_more"`
	Data    []struct {
		ID      string `json:"id"`
		OrderID int64  `json:"order_id"`
		Status  string `json:"status"`
	} `json:"data"`
}

func listCharges(t *testing.T, base, query string) (chargeList, apitest.Result) {
	t.Helper()
	r, err := apitest.Do(t, nil, "GET", base+"/v1/charges?"+query, nil, nil)
	if err != nil || r.Status != 200 {
		t.Fatalf("GET /v1/charges?%s: %d %s, %v", query, r.Status, r.Body, err)
	}
	var l chargeList
	if err := json.Unmarshal(r.Body, &l); err != nil {
		t.Fatalf("decoding the list %s: %v", r.Body, err)
	}
	if l.Object != "list" || l.URL != "/v1/charges" || l.HasMore == nil || l.Data == nil {
		t.Fatalf("GET /v1/charges?%s: %s is not a list object (object, url, has_more, data)", query, r.Body)
	}
	return l, r
}

// storeCharges inserts n charges of the demo merchant on order straight
// into the store, from 16 goroutines (the stores commit concurrent inserts
// together), and returns their ids.
func storeCharges(t *testing.T, s chargeonce.Store, order int64, n int) []string {
	t.Helper()
	ids := make([]string, n)
	var wg sync.WaitGroup
	const workers = 16
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				ids[i] = fmt.Sprintf("ch_bulk_%d_%06d", order, i)
				_, _, err := s.KeyInsert(t.Context(), chargeonce.KeyInsertParams{
					Fingerprint: "fp", Token: "tok", Lease: time.Hour,
					Charge: chargeonce.Charge{
						ID: ids[i], MerchantID: "demo", IdempotencyKey: ids[i], OrderID: order,
						AmountCents: 100, Currency: "BRL", PaymentToken: "tok_ok",
					},
				})
				if err != nil {
					t.Errorf("KeyInsert: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return ids
}

// TestListChargesBounded: one order with 20,000 charges. GET
// /v1/charges?order_id=N answers one page (the default 10, has_more), not
// everything the order holds; limit=100 answers 100.
func TestListChargesBounded(t *testing.T) {
	t.Parallel()
	const n = 20000
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			f := setup(t, kind, engine.Options{}, acquirer.Options{})
			order := orderSeq.Add(1)
			start := time.Now()
			storeCharges(t, f.store, order, n)
			t.Logf("%s: stored %d charges on one order in %v", kind, n, time.Since(start).Round(time.Millisecond))

			for _, tt := range []struct {
				query string
				want  int
			}{
				{fmt.Sprintf("order_id=%d", order), chargeonce.ChargesListDefaultLimit},
				{fmt.Sprintf("order_id=%d&limit=100", order), 100},
				{fmt.Sprintf("order_id=%d&limit=100&status=processing", order), 100},
				{"limit=100", 100},
			} {
				start := time.Now()
				r, err := apitest.Do(t, nil, "GET", f.inst.URL+"/v1/charges?"+tt.query, nil, nil)
				elapsed := time.Since(start)
				if err != nil || r.Status != 200 {
					t.Fatalf("GET /v1/charges?%s: %d, %v", tt.query, r.Status, err)
				}
				var l chargeList
				if err := json.Unmarshal(r.Body, &l); err != nil {
					t.Fatalf("decoding the list: %v", err)
				}
				t.Logf("%s: GET /v1/charges?%s over %d charges: %d charges, %d bytes, %v",
					kind, tt.query, n, len(l.Data), len(r.Body), elapsed.Round(10*time.Microsecond))
				if len(l.Data) != tt.want || l.HasMore == nil || !*l.HasMore {
					t.Fatalf("GET /v1/charges?%s: %d charges, has_more %v; want one page of %d, has_more true",
						tt.query, len(l.Data), l.HasMore, tt.want)
				}
				if most := tt.want * 400; len(r.Body) > most {
					t.Fatalf("GET /v1/charges?%s: %d bytes, more than %d for one page", tt.query, len(r.Body), most)
				}
			}
		})
	}
}

// TestListChargesStrictQuery: a list request is read strictly; every
// mistake is a 400 validation-failed that names the parameter.
func TestListChargesStrictQuery(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			f := setup(t, kind, engine.Options{}, acquirer.Options{})
			order := orderSeq.Add(1)
			r := apitest.Charge(t, f.inst.URL, "list-strict-"+fmt.Sprint(order), chargeBody(order, "tok_ok"))
			var ch struct{ ID string }
			if err := json.Unmarshal(r.Body, &ch); err != nil || r.Status != 201 {
				t.Fatalf("charge: %d %s", r.Status, r.Body)
			}
			for _, tt := range []struct {
				query, field string
			}{
				{"limit=0", "limit"},
				{"limit=101", "limit"},
				{"limit=-1", "limit"},
				{"limit=ten", "limit"},
				{"limit=", "limit"},
				{"limit=1e2", "limit"},
				{"limit=10&limit=20", "limit"},
				{"order_id=0", "order_id"},
				{"order_id=abc", "order_id"},
				{"order_id=", "order_id"},
				{"order_id=1&order_id=2", "order_id"},
				{"status=refunded", "status"},
				{"status=", "status"},
				{"starting_after=" + ch.ID + "&ending_before=" + ch.ID, "ending_before"},
				{"starting_after=ch_no_such_charge", "starting_after"},
				{"ending_before=ch_no_such_charge", "ending_before"},
				{"starting_after=", "starting_after"},
				{"starting_after=%00", "starting_after"},
				{"order=1", "order"},
				{"order_id=1&offset=20", "offset"},
				{"page=2", "page"},
				{"Limit=5", "Limit"},
				{"expand[]=data.customer", "expand[]"},
			} {
				r, err := apitest.Do(t, nil, "GET", f.inst.URL+"/v1/charges?"+tt.query, nil, nil)
				if err != nil {
					t.Fatalf("GET /v1/charges?%s: %v", tt.query, err)
				}
				if r.Status != 400 {
					t.Errorf("GET /v1/charges?%s: %d %s, want 400 naming %s", tt.query, r.Status, r.Body, tt.field)
					continue
				}
				p := decodeProblem(t, r)
				if p.Type != chargeonce.ProblemTypeBase+chargeonce.EINVALID || p.Field != tt.field {
					t.Errorf("GET /v1/charges?%s: type %s field %q (%s), want validation-failed naming %s", tt.query, p.Type, p.Field, p.Detail, tt.field)
				}
			}
			// Another merchant's charge is no cursor either (and says
			// nothing about whether it exists).
			r, err := apitest.Do(t, nil, "GET", f.inst.URL+"/v1/charges?starting_after="+url.QueryEscape(ch.ID), nil,
				map[string]string{"Authorization": "Bearer " + apitest.OtherAPIKey})
			if err != nil || r.Status != 400 || decodeProblem(t, r).Field != "starting_after" {
				t.Errorf("another merchant's cursor: %d %s, %v; want 400 naming starting_after", r.Status, r.Body, err)
			}
		})
	}
}

// TestListChargesPages walks a merchant's charges over HTTP a page at a
// time, forward with starting_after and back with ending_before, while
// new charges arrive: every charge that existed before is listed exactly
// once, newest first, and no charge twice.
func TestListChargesPages(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			f := setup(t, kind, engine.Options{}, acquirer.Options{})
			order := orderSeq.Add(1)
			var want []string // newest first
			for i := range 23 {
				r := apitest.Charge(t, f.inst.URL, fmt.Sprintf("pages-%d-%d", order, i), chargeBody(order, "tok_ok"))
				var ch struct{ ID string }
				if err := json.Unmarshal(r.Body, &ch); err != nil || r.Status != 201 {
					t.Fatalf("charge %d: %d %s", i, r.Status, r.Body)
				}
				want = append([]string{ch.ID}, want...)
			}

			// New charges on another order keep arriving during the walks.
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					apitest.Charge(t, f.inst.URL, fmt.Sprintf("pages-late-%d-%d", order, i), chargeBody(order+1, "tok_ok"))
				}
			})
			defer func() { close(stop); wg.Wait() }()

			for _, filter := range []string{fmt.Sprintf("order_id=%d&", order), ""} {
				var got []string
				query := filter + "limit=4"
				for pages := 0; ; pages++ {
					if pages > 1000 {
						t.Fatal("more than 1000 pages")
					}
					l, _ := listCharges(t, f.inst.URL, query)
					for _, c := range l.Data {
						got = append(got, c.ID)
					}
					if !*l.HasMore {
						break
					}
					query = filter + "limit=4&starting_after=" + l.Data[len(l.Data)-1].ID
				}
				seen := map[string]bool{}
				var old []string
				for _, id := range got {
					if seen[id] {
						t.Fatalf("%q: charge %s listed twice", filter, id)
					}
					seen[id] = true
					if slices.Contains(want, id) {
						old = append(old, id)
					}
				}
				if !slices.Equal(old, want) {
					t.Fatalf("%q: pages list %v of the order's charges, want each once, newest first: %v", filter, old, want)
				}
				t.Logf("%s %q: %d charges over the pages, %d of them older than the walk", kind, filter, len(got), len(old))
			}

			// Backward from the oldest of the order's charges.
			got := []string{want[len(want)-1]}
			query := fmt.Sprintf("order_id=%d&limit=5&ending_before=%s", order, want[len(want)-1])
			for {
				l, _ := listCharges(t, f.inst.URL, query)
				var ids []string
				for _, c := range l.Data {
					ids = append(ids, c.ID)
				}
				got = append(ids, got...)
				if !*l.HasMore {
					break
				}
				query = fmt.Sprintf("order_id=%d&limit=5&ending_before=%s", order, ids[0])
			}
			if !slices.Equal(got, want) {
				t.Fatalf("backward: %v, want %v", got, want)
			}
		})
	}
}
