package racedemo_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/chargeonce/chargeonce/internal/pgtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(pgtest.M(m),
		// pgxpool's background health check outlives a closed pool briefly
		// by design.
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	)
}
