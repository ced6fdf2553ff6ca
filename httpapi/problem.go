package httpapi

import (
	"net/http"
	"strconv"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/wire"
)

// defaultRetryAfter is sent with a 409 or a 503 whose error carries no
// RetryAfter of its own: the attempt holding a key normally finishes within
// the acquirer timeout, and a database outage or a failover lasts seconds,
// after which clients back off further on their own.
const defaultRetryAfter = time.Second

// retryAfterHeader formats d as Retry-After's delay-seconds: rounded up to
// whole seconds (a client must not come back before d), at least 1.
func retryAfterHeader(d time.Duration) string {
	return strconv.FormatInt(max(1, int64((d+time.Second-1)/time.Second)), 10)
}

// problemFor returns err's code and how it is shown (wire's one table).
func problemFor(err error) (string, wire.ProblemInfo) { return wire.ProblemFor(err) }

// Problem returns the status and the exact application/problem+json body
// the API answers for err.
func Problem(err error) (status int, body []byte) { return wire.Problem(err, "") }

// problem is Problem with the request id requestID (if any) in the body.
func problem(err error, requestID string) (status int, body []byte) {
	return wire.Problem(err, requestID)
}

// RejectionObserver is told every request the API refused as the client's
// mistake or over its rate: 400, 401, 405, 413 and 429 (metrics). Its labels
// are bounded: route is the mux pattern that matched (never the raw path),
// problem the error's slug. Implementations must be safe for concurrent use.
type RejectionObserver interface {
	Rejected(route string, status int, problem string)
}

// rejection reports whether status is counted by a RejectionObserver.
func rejection(status int) bool {
	switch status {
	case http.StatusBadRequest, http.StatusUnauthorized, http.StatusMethodNotAllowed,
		http.StatusRequestEntityTooLarge, http.StatusTooManyRequests:
		return true
	}
	return false
}

// writeError writes err as application/problem+json.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	code, _ := problemFor(err)
	noteCode(r, code)
	id := requestID(r)
	status, body := problem(err, id)
	if s.rejected != nil && rejection(status) {
		s.rejected.Rejected(r.Pattern, status, code)
	}
	if status >= 500 {
		s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "request_id", id, "err", err)
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	if ra := chargeonce.ErrorRetryAfter(err); ra > 0 {
		h.Set("Retry-After", retryAfterHeader(ra))
	} else if code == chargeonce.EINPROGRESS || status == http.StatusServiceUnavailable {
		h.Set("Retry-After", retryAfterHeader(defaultRetryAfter))
	}
	if code == chargeonce.EUNAUTHORIZED {
		h.Set("WWW-Authenticate", `Bearer realm="chargeonce"`)
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
