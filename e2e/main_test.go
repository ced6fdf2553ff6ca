// Package e2e holds the end-to-end tests: several chargeonce instances on
// one real PostgreSQL database, real HTTP on loopback, and the acquirer
// simulator as a separate HTTP service.
package e2e

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/chargeonce/chargeonce/internal/pgtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(withBuildRemoved{pgtest.M(m)},
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	)
}
