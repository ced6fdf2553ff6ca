package tracing_test

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/postgres"
	"github.com/chargeonce/chargeonce/sqlite"
	"github.com/chargeonce/chargeonce/tracing"
	"github.com/chargeonce/chargeonce/webhook"
)

// rootInterfaces are the interfaces the root package declares, by name.
// TestTracedStoreKeepsEveryCapability fails on one it does not list, so
// that a capability added to the stores is checked from its first day.
var rootInterfaces = map[string]reflect.Type{
	"Store":           reflect.TypeFor[chargeonce.Store](),
	"Outbox":          reflect.TypeFor[chargeonce.Outbox](),
	"Webhooks":        reflect.TypeFor[chargeonce.Webhooks](),
	"Refunds":         reflect.TypeFor[chargeonce.Refunds](),
	"Operations":      reflect.TypeFor[chargeonce.Operations](),
	"HistoryAppender": reflect.TypeFor[chargeonce.HistoryAppender](),
	"OperatorStore":   reflect.TypeFor[chargeonce.OperatorStore](),
	"ReconOps":        reflect.TypeFor[chargeonce.ReconOps](),
	"ReconStore":      reflect.TypeFor[chargeonce.ReconStore](),
	// Not the stores' (the acquirers' and their errors'): listed so the
	// list is complete, never implemented by a store.
	"Acquirer":        reflect.TypeFor[chargeonce.Acquirer](),
	"AcquirerIDError": reflect.TypeFor[chargeonce.AcquirerIDError](),
	"ManualCapturer":  reflect.TypeFor[chargeonce.ManualCapturer](),
	"Refunder":        reflect.TypeFor[chargeonce.Refunder](),
	"Ledger":          reflect.TypeFor[chargeonce.Ledger](),
	"Finality":        reflect.TypeFor[chargeonce.Finality](),
	"Fencer":          reflect.TypeFor[chargeonce.Fencer](),
}

// TestTracedStoreKeepsEveryCapability (issue 47.10): with tracing on,
// every store call goes through the traced wrapper, and code finds the
// store's optional capabilities (ReconStore, ReconOps, OperatorStore,
// HistoryAppender) by asking it for them. The wrapper embedded
// chargeonce.Store only, so it dropped every one of them. Each interface
// of the root package that a store implements must be implemented by the
// store wrapped, for both stores; an interface the root package declares
// that this test does not know fails it.
func TestTracedStoreKeepsEveryCapability(t *testing.T) {
	t.Parallel()
	fset := token.NewFileSet()
	files, err := filepath.Glob("../*.go")
	if err != nil {
		t.Fatal(err)
	}
	declared := 0
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		if f.Name.Name != "chargeonce" {
			continue // an external test package
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.TYPE {
				continue
			}
			for _, spec := range g.Specs {
				ts := spec.(*ast.TypeSpec)
				if _, ok := ts.Type.(*ast.InterfaceType); !ok || !ts.Name.IsExported() {
					continue
				}
				declared++
				if _, ok := rootInterfaces[ts.Name.Name]; !ok {
					t.Errorf("the root package declares interface %s (%s), which rootInterfaces does not list: add it, so that the traced store is checked for it",
						ts.Name.Name, fset.Position(ts.Pos()))
				}
			}
		}
	}
	if declared < len(rootInterfaces) {
		t.Errorf("the root package declares %d interfaces, fewer than the %d rootInterfaces lists: remove the ones gone", declared, len(rootInterfaces))
	}
	tr := tracing.NewWithExporter(tracetest.NewInMemoryExporter())
	for system, store := range map[string]chargeonce.Store{"postgresql": (*postgres.Store)(nil), "sqlite": (*sqlite.Store)(nil)} {
		traced := reflect.TypeOf(tr.Store(store, system))
		has := 0
		for name, iface := range rootInterfaces {
			if !reflect.TypeOf(store).Implements(iface) {
				continue
			}
			has++
			if !traced.Implements(iface) {
				t.Errorf("the %s store implements chargeonce.%s; wrapped by tracing it does not", system, name)
			}
		}
		if has < 5 {
			t.Errorf("the %s store implements only %d of the root interfaces; the test looks at the wrong types", system, has)
		}
	}
}

// TestReconciliationCompletedDeliveredWithTracing (issue 47.10): the object
// of a reconciliation.completed event is the merchant's share of the run,
// read through the store as the webhook sender and GET /v1/events read it.
// Through the traced store it was looked up as a charge (ENOTFOUND), and
// the delivery was retried every lease, never sent.
func TestReconciliationCompletedDeliveredWithTracing(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"postgres", "sqlite"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			raw := apitest.Store(t, kind)
			store := tracing.NewWithExporter(tracetest.NewInMemoryExporter()).Store(raw, kind)
			rs, ok := raw.(chargeonce.ReconStore)
			if !ok {
				t.Fatalf("the %s store is no ReconStore", kind)
			}
			from := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
			run := chargeonce.ReconRun{Acquirer: "sim", Period: "2026-12-06", From: from, To: from.Add(24 * time.Hour),
				Counts: map[string]int{}, Report: []byte(`{}`),
				Merchants: []chargeonce.ReconMerchantRun{{Acquirer: "sim", Period: "2026-12-06", MerchantID: "demo",
					ID: chargeonce.ReconMerchantRunID("sim", "2026-12-06", "demo"), From: from, To: from.Add(24 * time.Hour),
					Charges: 3, Matched: 3, Counts: map[string]int{}}},
			}
			if _, err := rs.ReconRunSave(t.Context(), run); err != nil {
				t.Fatal(err)
			}
			page, err := store.WebhookEventsList(t.Context(), chargeonce.EventsListParams{MerchantID: "demo", Limit: 10})
			if err != nil {
				t.Fatal(err)
			}
			var ev *chargeonce.WebhookEvent
			for i := range page.Events {
				if page.Events[i].Type == chargeonce.EventReconciliationCompleted {
					ev = &page.Events[i]
				}
			}
			if ev == nil {
				t.Fatalf("no reconciliation.completed event among %+v", page.Events)
			}
			object, err := webhook.EventObject(t.Context(), store, *ev)
			if err != nil {
				t.Fatalf("the event's object through the traced store: %v", err)
			}
			var got struct {
				Object  string `json:"object"`
				Period  string `json:"period"`
				Charges int    `json:"charges"`
			}
			if err := json.Unmarshal(object, &got); err != nil || got.Period != "2026-12-06" || got.Charges != 3 {
				t.Fatalf("the event's object: %s (%v); want the merchant's share of the run", object, err)
			}
		})
	}
}
