package pgtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/chargeonce/chargeonce/internal/pgtest"
)

// A server of the test's own survives a crash (pg_ctl stop -m immediate)
// with every acknowledged commit, and comes back on the same port.
func TestServerCrashAndRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewServer(t)
	conn := connect(t, s.URL())
	if _, err := conn.Exec(ctx, `CREATE TABLE w (id int); INSERT INTO w VALUES (1), (2)`); err != nil {
		t.Fatal(err)
	}
	s.Crash()
	if _, err := conn.Exec(ctx, `SELECT 1`); err == nil {
		t.Fatal("a connection to the crashed server still works")
	}
	s.Start()
	var n int
	if err := connect(t, s.URL()).QueryRow(ctx, `SELECT count(*) FROM w`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("after the restart: %d rows, %v; want the 2 committed", n, err)
	}
}

// A pair's URL reaches the primary while it lives (target_session_attrs
// skips the standby listed first), the standby is synchronous, and after
// Failover the same URL reaches the promoted standby with every row
// committed on the primary.
func TestPairFailover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := pgtest.NewPair(t)
	where := func() (port int, recovering bool) {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		c, err := pgx.Connect(cctx, p.URL())
		if err != nil {
			t.Fatalf("connecting through %s: %v", p.URL(), err)
		}
		defer c.Close(ctx)
		if err := c.QueryRow(ctx, `SELECT inet_server_port(), pg_is_in_recovery()`).Scan(&port, &recovering); err != nil {
			t.Fatal(err)
		}
		return port, recovering
	}
	if port, rec := where(); port != p.Primary.Port() || rec {
		t.Fatalf("the pair's URL reached port %d (in recovery %v); want the primary on %d", port, rec, p.Primary.Port())
	}
	if _, err := connect(t, p.URL()).Exec(ctx, `CREATE TABLE w (id int); INSERT INTO w VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	p.Failover()
	if port, rec := where(); port != p.Standby.Port() || rec {
		t.Fatalf("after failover the URL reached port %d (in recovery %v); want the promoted standby on %d", port, rec, p.Standby.Port())
	}
	var n int
	if err := connect(t, p.URL()).QueryRow(ctx, `SELECT count(*) FROM w`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("after failover: %d rows, %v; want the committed one", n, err)
	}
}
