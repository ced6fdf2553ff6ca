package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/internal/pgtest"
)

// Errors that mean "the database cannot do this now" become EUNAVAILABLE
// (503, retry with the same key) with the driver's error kept in the chain;
// errors that mean the statement itself is wrong stay internal (500).
func TestTranslate(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		err  error
		want string
	}{
		{"admin shutdown", &pgconn.PgError{Code: "57P01"}, chargeonce.EUNAVAILABLE},
		{"crash shutdown", &pgconn.PgError{Code: "57P02"}, chargeonce.EUNAVAILABLE},
		{"cannot connect now", &pgconn.PgError{Code: "57P03"}, chargeonce.EUNAVAILABLE},
		{"connection failure", &pgconn.PgError{Code: "08006"}, chargeonce.EUNAVAILABLE},
		{"too many connections", &pgconn.PgError{Code: "53300"}, chargeonce.EUNAVAILABLE},
		{"read-only standby", &pgconn.PgError{Code: "25006"}, chargeonce.EUNAVAILABLE},
		{"statement timeout", &pgconn.PgError{Code: "57014"}, chargeonce.EUNAVAILABLE},
		{"lock timeout", &pgconn.PgError{Code: "55P03"}, chargeonce.EUNAVAILABLE},
		{"idle session timeout", &pgconn.PgError{Code: "57P05"}, chargeonce.EUNAVAILABLE},
		{"database dropped", &pgconn.PgError{Code: "57P04"}, chargeonce.EUNAVAILABLE},
		{"object in use", &pgconn.PgError{Code: "55006"}, chargeonce.EUNAVAILABLE},
		{"idle in transaction timeout", &pgconn.PgError{Code: "25P03"}, chargeonce.EUNAVAILABLE},
		{"transaction timeout", &pgconn.PgError{Code: "25P04"}, chargeonce.EUNAVAILABLE},
		{"io error", &pgconn.PgError{Code: "58030"}, chargeonce.EUNAVAILABLE},
		{"out of memory", &pgconn.PgError{Code: "53200"}, chargeonce.EUNAVAILABLE},
		{"serialization", &pgconn.PgError{Code: "40001"}, chargeonce.EUNAVAILABLE},
		{"connection exception", &pgconn.PgError{Code: "08000"}, chargeonce.EUNAVAILABLE},
		{"check violation", &pgconn.PgError{Code: "23514"}, chargeonce.EINTERNAL},
		{"undefined table", &pgconn.PgError{Code: "42P01"}, chargeonce.EINTERNAL},
		{"unexpected EOF", fmt.Errorf("failed to receive message: %w", io.ErrUnexpectedEOF), chargeonce.EUNAVAILABLE},
		{"refused", &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, chargeonce.EUNAVAILABLE},
		{"reset", fmt.Errorf("write: %w", syscall.ECONNRESET), chargeonce.EUNAVAILABLE},
		{"deadline", fmt.Errorf("query: %w", context.DeadlineExceeded), chargeonce.EUNAVAILABLE},
		{"syntax error", &pgconn.PgError{Code: "42601"}, chargeonce.EINTERNAL},
		{"unique violation", &pgconn.PgError{Code: "23505"}, chargeonce.EINTERNAL},
		{"no rows", pgx.ErrNoRows, chargeonce.EINTERNAL},
		{"plain", errors.New("scan: wrong type"), chargeonce.EINTERNAL},
	} {
		got := translate(c.err)
		if code := chargeonce.ErrorCode(got); code != c.want {
			t.Errorf("%s: code %s, want %s", c.name, code, c.want)
		}
		if !errors.Is(got, c.err) {
			t.Errorf("%s: the driver's error is no longer in the chain: %v", c.name, got)
		}
	}
	if translate(nil) != nil {
		t.Error("translate(nil) != nil")
	}
}

// A store whose database is gone answers EUNAVAILABLE on every method, not
// an internal error.
func TestStoreUnreachableIsUnavailable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	cfg := "postgres://postgres@" + addr + "/x?sslmode=disable&connect_timeout=2"
	pcfg, err := pgxpoolParse(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := &Store{pool: pcfg}
	defer s.Close()
	if _, err := s.KeyGet(ctx, "m", "k"); chargeonce.ErrorCode(err) != chargeonce.EUNAVAILABLE {
		t.Errorf("KeyGet on a dead server: %v (code %s); want unavailable", err, chargeonce.ErrorCode(err))
	}
	if _, err := s.KeysStuck(ctx); chargeonce.ErrorCode(err) != chargeonce.EUNAVAILABLE {
		t.Errorf("KeysStuck on a dead server: %v; want unavailable", err)
	}
}

// pgxpoolParse opens a pool lazily (no connection is made until used).
func pgxpoolParse(connString string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		return nil, err
	}
	return pgxpool.NewWithConfig(context.Background(), cfg)
}

// A pool whose every connection is in use, so that a call's deadline passes
// while it waits for one, is a busy instance, not an unreachable database:
// the 503's detail and the log line say which.
func TestExhaustedPoolIsNotUnreachable(t *testing.T) {
	t.Parallel()
	s, err := Open(t.Context(), pgtest.URL(t), WithMaxConns(1))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	held, err := s.pool.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	_, err = s.ChargeGet(ctx, "m", "ch_x")
	if chargeonce.ErrorCode(err) != chargeonce.EUNAVAILABLE || strings.Contains(err.Error(), "unreachable") || !strings.Contains(err.Error(), "every connection") {
		t.Fatalf("ChargeGet with every connection in use: %v; want unavailable, saying the connections are in use, not unreachable", err)
	}
}

// A migration step that timed out on a lock, or lost a deadlock to traffic,
// was rolled back whole: it is run again. Any other error ends the retries.
func TestRetryLocksRetriesLockTimeoutsAndDeadlocks(t *testing.T) {
	t.Parallel()
	for _, code := range []string{"55P03", "40P01"} {
		calls := 0
		err := retryLocks(t.Context(), func() error {
			calls++
			if calls == 1 {
				return &pgconn.PgError{Code: code}
			}
			return nil
		})
		if err != nil || calls != 2 {
			t.Errorf("SQLSTATE %s then success: err %v after %d calls; want nil after 2", code, err, calls)
		}
	}
	calls := 0
	err := retryLocks(t.Context(), func() error { calls++; return &pgconn.PgError{Code: "42601"} })
	if err == nil || calls != 1 {
		t.Errorf("a syntax error: err %v after %d calls; want it at once", err, calls)
	}
}
