package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"

	"github.com/chargeonce/chargeonce"
)

// translate maps a driver error that means "the database cannot do this
// now" to a chargeonce.EUNAVAILABLE error, keeping err in the chain for the
// logs; any other error is returned as it is.
//
// Unavailable is not the same as "nothing happened": a connection lost
// while a statement ran, or on its COMMIT, leaves the statement's outcome
// unknown (it may have committed), so the client is told to retry with the
// same Idempotency-Key, which finds whatever did happen. A real 500 is left
// for bugs.
func translate(err error) error {
	if err == nil || !unavailable(err) {
		return err
	}
	return fmt.Errorf("%w: %w", chargeonce.Errorf(chargeonce.EUNAVAILABLE,
		"%s; the outcome is unknown: retry with the same Idempotency-Key", why(err)), err)
}

// why says, for an operator reading the log or a client reading the 503,
// which way the database could not answer: a pool whose connections are
// all in use, or a slow statement, is not an unreachable database.
func why(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch code := pgErr.Code; {
		case code == "57014":
			return "the database took too long to answer"
		case code == "55P03", code == "55006":
			return "the database is busy: a lock is held elsewhere"
		case code == "25006":
			return "the database is read-only now (a standby, or a failover under way)"
		case code == "40001", code == "40P01":
			return "the database refused a conflicting transaction"
		case strings.HasPrefix(code, "53"):
			return "the database is out of resources (connections, memory or disk)"
		}
		return "the database is unreachable or shutting down"
	}
	switch {
	case errors.Is(err, puddle.ErrClosedPool):
		return "this instance is shutting down"
	case errors.Is(err, context.DeadlineExceeded), pgconn.Timeout(err):
		return "the database did not answer in time (it is slow, or every connection of this instance is in use)"
	}
	return "the database is unreachable"
}

// unavailable reports whether err says the database is unreachable, going
// away, overloaded, too slow now (a timeout, a lock held elsewhere) or
// read-only (a standby, before or during a failover), rather than that the
// statement itself is wrong. Every SQLSTATE class that can come of the
// moment rather than of the statement is here; the others (syntax, a
// constraint, a missing table) are bugs and stay 500.
func unavailable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch code := pgErr.Code; {
		case strings.HasPrefix(code, "08"), // connection exception
			strings.HasPrefix(code, "53"),                     // insufficient resources (too many connections, disk full, out of memory)
			code == "57014",                                   // statement_timeout, or a cancel: the database was too slow now
			code == "55P03",                                   // lock_timeout: a lock held elsewhere (a migration, an operator)
			code == "55006",                                   // object in use
			code == "57P01", code == "57P02", code == "57P03", // admin/crash shutdown, cannot connect now
			code == "57P04", code == "57P05", // database dropped, idle session timeout
			code == "25006",                  // read-only transaction: connected to a standby
			code == "25P03", code == "25P04", // idle-in-transaction and transaction timeouts
			code == "40001", code == "40P01", // serialization failure, deadlock: retry
			code == "58030": // I/O error on the server
			return true
		}
		return false
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	switch {
	case pgconn.SafeToRetry(err), pgconn.Timeout(err),
		errors.As(err, &connectErr), errors.As(err, &netErr),
		errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, puddle.ErrClosedPool), // the store was closed: this instance is shutting down
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return true
	}
	return false
}
