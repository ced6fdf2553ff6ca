package pgtest

import (
	"go.uber.org/goleak"
)

// LeakOptions are the goroutines that outlive a test by design, for tests
// of packages that open PostgreSQL pools and HTTP connections: pgxpool's
// background health check lingers a moment after Close, and net/http's
// keep-alive readers wait on their sockets until the idle connection is
// reaped, and a connection answered with an error (431) sleeps half a
// second before it closes, so the client reads the answer first.
var LeakOptions = []goleak.Option{
	goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
	goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	goleak.IgnoreAnyFunction("net/http.(*conn).closeWriteAndWait"),
}

// VerifyMain runs the tests, stops the throwaway cluster, then fails the
// run if goroutines leaked (beyond LeakOptions), and exits:
//
//	func TestMain(m *testing.M) { pgtest.VerifyMain(m) }
func VerifyMain(m TestingM, opts ...goleak.Option) {
	goleak.VerifyTestMain(M(m), append(append([]goleak.Option{}, LeakOptions...), opts...)...)
}
