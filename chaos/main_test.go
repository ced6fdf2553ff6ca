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

	"github.com/chargeonce/chargeonce/internal/pgtest"
)

func TestMain(m *testing.M) {
	pgtest.VerifyMain(withBuildsRemoved{pgtest.M(m)})
}
