// Package e2e holds the end-to-end tests: several chargeonce instances on
// one real PostgreSQL database, real HTTP on loopback, and the acquirer
// simulator as a separate HTTP service.
package e2e

import (
	"testing"

	"github.com/chargeonce/chargeonce/internal/pgtest"
)

func TestMain(m *testing.M) {
	pgtest.VerifyMain(withBuildRemoved{pgtest.M(m)})
}
