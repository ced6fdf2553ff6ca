package main

import (
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/internal/pgtest"
	"github.com/chargeonce/chargeonce/tracing"
)

// With tracing on, the runtime's store is wrapped in spans; the operators'
// store and the engine's history must still reach the store underneath, on
// both stores: an instance exporting traces keeps its admin listener and
// its charges' history.
func TestTracingKeepsOperatorsAndHistory(t *testing.T) {
	dbs := map[string]string{
		"sqlite":   "sqlite:" + filepath.Join(t.TempDir(), "t.db"),
		"postgres": pgtest.URL(t),
	}
	for name, db := range dbs {
		t.Run(name, func(t *testing.T) {
			f := runtimeFlags{db: db, tracing: tracing.NewWithExporter(tracetest.NewInMemoryExporter())}
			f.acq.target, f.acq.timeout = "http://127.0.0.1:1", time.Second
			f.lease, f.reconcileEvery, f.keyTTL, f.sweepEvery = time.Second, time.Second, time.Hour, time.Minute
			f.webhooks.scale, f.webhooks.every = 1, time.Second
			rt, err := f.open(t.Context(), slog.New(slog.DiscardHandler), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer rt.close()
			if _, ok := rt.operators().(chargeonce.OperatorStore); !ok {
				t.Errorf("the admin listener's store (%T) is no OperatorStore", rt.operators())
			}
			if historyOf(rt.operators()) == nil {
				t.Errorf("the engine's history is off: %T appends none", rt.operators())
			}
			// The webhook sender and the API read events' objects through
			// the traced store: a reconciliation.completed event's is a
			// ReconStore's.
			for name, iface := range map[string]func(chargeonce.Store) bool{
				"ReconStore":    func(s chargeonce.Store) bool { _, ok := s.(chargeonce.ReconStore); return ok },
				"ReconOps":      func(s chargeonce.Store) bool { _, ok := s.(chargeonce.ReconOps); return ok },
				"OperatorStore": func(s chargeonce.Store) bool { _, ok := s.(chargeonce.OperatorStore); return ok },
			} {
				if !iface(rt.store) {
					t.Errorf("the traced store (%T) is no %s", rt.store, name)
				}
			}
		})
	}
}
