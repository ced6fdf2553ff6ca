package httpapi

import (
	"context"
	"crypto/rand"
	"log/slog"
	"net/http"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/idempotency"
)

// Outcomes a request line can carry. The charge outcomes follow SPEC's
// table; "ok" is any other success (a GET, a probe).
const (
	OutcomeCreated       = "created"
	OutcomeReplayed      = "replayed"
	OutcomeInProgress    = "in-progress"
	OutcomeKeyReused     = "key-reused"
	OutcomeDeclined      = "declined"
	OutcomeUnknown       = "unknown"
	OutcomeOverloaded    = "overloaded"
	OutcomeClientError   = "client-error"
	OutcomeUnavailable   = "unavailable"
	OutcomeInternalError = "internal-error"
	OutcomeOK            = "ok"
)

// overloadedCode is the slug of SPEC's 503 overloaded. It is spelled here
// rather than taken from package chargeonce so that this file does not
// depend on when admission control lands.
const overloadedCode = "overloaded"

// KeyHashLen is how many hex digits of SHA-256(merchant, key) a request
// line carries: enough to follow one intent's attempts through the logs,
// never the key itself.
const KeyHashLen = idempotency.KeyHashLen

// LogRequests wraps next so that every request is logged once, when it
// ends, at Info (5xx at Warn) with: method, route (the pattern that served
// it, never the raw path, which a client controls), status, outcome,
// latency_ms, request_id (the Request-Id header it gives the answer), and, once the request is authenticated, merchant and key_hash
// (a hash of the merchant and the Idempotency-Key). Neither the API key nor
// the idempotency key is ever logged: both are bearer secrets of a sort (a
// key lets whoever holds it learn an intent's stored answer).
func LogRequests(log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		note := newNote(w)
		r = r.WithContext(context.WithValue(r.Context(), noteKey{}, note))
		rec := &statusRecorder{ResponseWriter: w}
		next.ServeHTTP(rec, r)
		if rec.status == 0 {
			rec.status = http.StatusOK
		}
		level := slog.LevelInfo
		if rec.status >= 500 {
			level = slog.LevelWarn
		}
		if !log.Enabled(r.Context(), level) {
			return // nothing to build: at --log-level warn a busy server skips the hashing
		}
		replayed := rec.Header().Get("Idempotent-Replayed") == "true"
		attrs := make([]slog.Attr, 0, 8)
		attrs = append(attrs,
			slog.String("method", r.Method),
			slog.String("route", r.Pattern),
			slog.Int("status", rec.status),
			slog.String("outcome", outcome(rec.status, replayed, note.code)),
			slog.Float64("latency_ms", float64(time.Since(start).Microseconds())/1000),
			slog.String("request_id", note.requestID),
		)
		if note.merchant != "" {
			attrs = append(attrs, slog.String("merchant", note.merchant))
			if vs := r.Header.Values("Idempotency-Key"); len(vs) > 0 {
				if key, err := idempotency.ParseKey(vs); err == nil {
					attrs = append(attrs, slog.String("key_hash", KeyHash(note.merchant, key)))
				}
			}
		}
		log.LogAttrs(r.Context(), level, "request", attrs...)
	})
}

// KeyHash is how logs name an idempotency key: the first KeyHashLen hex
// digits of SHA-256 over the merchant and the (parsed) key, so the bare and
// the quoted spelling of one key hash alike, and one key of two merchants
// (two intents) hashes apart.
// The worker logs the same hash (idempotency.KeyHash).
func KeyHash(merchant, key string) string { return idempotency.KeyHash(merchant, key) }

// outcome names what a request came to, from its status, the replay flag
// and the error code its handler wrote (if any).
func outcome(status int, replayed bool, code string) string {
	switch {
	case replayed:
		return OutcomeReplayed
	case code == overloadedCode:
		return OutcomeOverloaded
	case code == chargeonce.EINPROGRESS:
		return OutcomeInProgress
	case code == chargeonce.EKEYREUSED:
		return OutcomeKeyReused
	case status == http.StatusCreated:
		return OutcomeCreated
	case status == http.StatusAccepted:
		return OutcomeUnknown
	case status == http.StatusPaymentRequired:
		return OutcomeDeclined
	case status == http.StatusServiceUnavailable:
		return OutcomeUnavailable
	case status >= 500:
		return OutcomeInternalError
	case status >= 400:
		return OutcomeClientError
	default:
		return OutcomeOK
	}
}

// requestNote is what a handler tells LogRequests about its request; it
// travels in the request's context.
type requestNote struct {
	requestID string
	merchant  string
	code      string
	// header is the Request-Id header's value slice, held here so that
	// setting it allocates nothing of its own.
	header [1]string
}

// newNote gives a request its id and sets w's Request-Id header to it.
func newNote(w http.ResponseWriter) *requestNote {
	note := &requestNote{requestID: NewRequestID()}
	note.header[0] = note.requestID
	w.Header()["Request-Id"] = note.header[:] // canonical already
	return note
}

type noteKey struct{}

// RequestIDPrefix starts every Request-Id.
const RequestIDPrefix = "req_"

// NewRequestID returns a new request id: RequestIDPrefix and 128 random
// bits. The server always makes its own: SPEC wants one unique per request,
// and an id a client chose could repeat another's or carry anything into
// the logs (a W3C traceparent is how a caller ties its own trace to ours).
//
// The id is built in one array and allocated once, as crypto/rand.Text
// builds its 26 characters of the RFC 4648 base32 alphabet (26 × 5 bits):
// Text and the concatenation allocated twice on every request.
func NewRequestID() string {
	var b [len(RequestIDPrefix) + 26]byte
	n := copy(b[:], RequestIDPrefix)
	_, _ = rand.Read(b[n:]) // never fails (crypto/rand)
	for i := n; i < len(b); i++ {
		b[i] = base32Alphabet[b[i]%32]
	}
	return string(b[:])
}

const base32Alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"

// requestID is the id r is answered under, or "" outside LogRequests and
// Server.
func requestID(r *http.Request) string {
	if n, ok := r.Context().Value(noteKey{}).(*requestNote); ok {
		return n.requestID
	}
	return ""
}

// withRequestID returns r with a request id, giving it one (and setting
// the Request-Id header of w) if LogRequests has not.
func withRequestID(w http.ResponseWriter, r *http.Request) *http.Request {
	if requestID(r) != "" {
		return r
	}
	return r.WithContext(context.WithValue(r.Context(), noteKey{}, newNote(w)))
}

// noteMerchant records the authenticated merchant of r for its log line.
func noteMerchant(r *http.Request, merchant string) {
	if n, ok := r.Context().Value(noteKey{}).(*requestNote); ok {
		n.merchant = merchant
	}
}

// noteCode records the error code r was answered with for its log line.
func noteCode(r *http.Request, code string) {
	if n, ok := r.Context().Value(noteKey{}).(*requestNote); ok {
		n.code = code
	}
}

// statusRecorder remembers the status a handler wrote.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }
