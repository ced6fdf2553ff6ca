// Package chaos is chargeonce's nemesis suite, in the manner of Jepsen and
// etcd's robustness tests: real processes (three `serve` instances, two
// queue `worker`s and a stand-alone acquirer) on a PostgreSQL server and a
// NATS JetStream server of their own, every network path between them
// through an in-process toxiproxy, clients running intents over HTTP and the
// queue while a nemesis injects faults on a seeded random schedule, a
// history of every operation, and a checker (porcupine) that judges the
// history against a model of what the contract allows, together with the
// acquirer's ledger of captures.
//
// `go test ./chaos/` runs a short version with fixed seeds; `make chaos`
// runs it for CHAOS_TIME (default 5m) with a printed seed, and CHAOS_SEED
// replays one. docs/testing.md describes it.
package chaos

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/chargeonce/chargeonce/internal/pgtest"
)

func TestMain(m *testing.M) {
	// toxiproxy's link goroutines can stay blocked on a channel send when
	// a proxy is stopped while a toxic was being added or removed on a
	// connection that is still open (inside the library, not ours; they
	// hold no descriptor once the proxy has stopped).
	pgtest.VerifyMain(withBuildsRemoved{pgtest.M(m)},
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2/toxics.(*ToxicStub).Run"))
}
