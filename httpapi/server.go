// Package httpapi is chargeonce's HTTP API (SPEC "HTTP API"): handlers,
// bearer authentication, request limits and problem+json errors.
package httpapi

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/idempotency"
	"github.com/chargeonce/chargeonce/webhook"
	"github.com/chargeonce/chargeonce/wire"
)

// MaxBodyBytes is the largest request body accepted (413 above it).
const MaxBodyBytes = wire.MaxBodyBytes

// Server serves the API. Build it with New.
type Server struct {
	engine   *engine.Engine
	store    chargeonce.Store
	keys     *Keys
	log      *slog.Logger
	outcomes OutcomeObserver
	rejected RejectionObserver
	mux      *http.ServeMux
	// webhooksAllowPrivate lets endpoints be http:// and private addresses.
	webhooksAllowPrivate bool
	// bodies counts each merchant's request bodies being read.
	bodies *readShares
	// reads gives each merchant its share of reads in flight.
	reads *readShares
	// webhookRate limits each merchant on the webhook and event routes.
	webhookRate *webhookLimits
	// tester sends test events to endpoints.
	tester *webhook.Tester
}

// OutcomeObserver is told the answer to every charge attempt the engine
// ran (metrics). Implementations must be safe for concurrent use.
type OutcomeObserver interface {
	// Outcome is called once per attempt with the HTTP status it answered
	// and whether it was a replay.
	Outcome(status int, replayed bool)
}

// OperationOutcomeObserver, when the OutcomeObserver implements it too,
// hears each attempt of a refund, a capture or a cancel (kind "refund",
// "capture", "cancel"), which Outcome does not count as charge attempts.
type OperationOutcomeObserver interface {
	OperationOutcome(kind string, status int, replayed bool)
}

// Config holds a Server's dependencies.
type Config struct {
	Engine *engine.Engine
	Store  chargeonce.Store
	Keys   *Keys
	Logger *slog.Logger
	// Metrics, when set, is served at GET /metrics.
	Metrics http.Handler
	// Outcomes, when set, is told the answer to every attempt that reached
	// the engine.
	Outcomes OutcomeObserver
	// Rejections, when set, is told every request refused as the client's
	// mistake or over its rate (see RejectionObserver).
	Rejections RejectionObserver
	// WebhooksAllowPrivate accepts webhook endpoint URLs that are http://
	// or name private addresses (--webhooks-allow-private).
	WebhooksAllowPrivate bool
	// MaxReadsPerMerchant is how many reads (GET /v1/…) of one merchant run
	// at once (DefaultMaxReadsPerMerchant when 0); more wait up to
	// ReadShareWait, then are answered 429.
	MaxReadsPerMerchant int
	// WebhooksRate is each merchant's rate on the webhook and event routes
	// (429 over it); DefaultWebhooksRate when zero.
	WebhooksRate engine.Rate
}

// New returns a Server.
func New(cfg Config) *Server {
	s := &Server{engine: cfg.Engine, store: cfg.Store, keys: cfg.Keys, log: cfg.Logger, outcomes: cfg.Outcomes, rejected: cfg.Rejections, mux: http.NewServeMux(),
		webhooksAllowPrivate: cfg.WebhooksAllowPrivate, bodies: newReadShares(MaxBodyReadsPerMerchant, "request bodies arriving"),
		webhookRate: &webhookLimits{shape: cfg.WebhooksRate}}
	s.tester = webhook.NewTester(cfg.WebhooksAllowPrivate)
	if s.webhookRate.shape.IsZero() {
		s.webhookRate.shape = DefaultWebhooksRate
	}
	perReads := cfg.MaxReadsPerMerchant
	if perReads <= 0 {
		perReads = DefaultMaxReadsPerMerchant
	}
	s.reads = newReadShares(perReads, "reads")
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.mux.HandleFunc("POST /v1/charges", s.handleCreateCharge)
	s.mux.HandleFunc("GET /v1/charges", s.handleListCharges)
	s.mux.HandleFunc("GET /v1/charges/{id}", s.handleGetCharge)
	s.mux.HandleFunc("/v1/charges", s.methodNotAllowed)
	s.mux.HandleFunc("/v1/charges/{id}", s.methodNotAllowed)
	s.routeWebhooks()
	s.routeRefunds()
	s.routeCapture()
	s.mux.HandleFunc("GET /healthz", s.handleHealthz)
	s.mux.HandleFunc("GET /readyz", s.handleReadyz)
	s.mux.HandleFunc("GET /openapi.yaml", handleOpenAPI)
	if cfg.Metrics != nil {
		s.mux.Handle("GET /metrics", cfg.Metrics)
	}
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, r, chargeonce.Errorf(chargeonce.ENOTFOUND, "no such endpoint: %s %s", r.Method, r.URL.Path))
	})
	return s
}

// ServeHTTP implements http.Handler. Every answer carries a Request-Id
// (LogRequests gives one; without it, ServeHTTP does).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	r = withRequestID(w, r)
	if r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/") {
		// Reads share the database fairly: each merchant gets its share
		// of reads in flight (SPEC "Tenants share the service fairly"). A
		// request without a valid key goes on to its handler's 401.
		if m, ok := s.keys.lookup(bearerToken(r), r.Host); ok {
			release, err := s.reads.take(r, m.ID)
			if err != nil {
				noteMerchant(r, m.ID)
				s.writeError(w, r, err)
				return
			}
			defer release()
		}
	}
	s.mux.ServeHTTP(w, r)
}

// bearerToken is r's bearer token, or "".
func bearerToken(r *http.Request) string {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(token)
}

func (s *Server) methodNotAllowed(w http.ResponseWriter, r *http.Request) {
	s.writeError(w, r, chargeonce.Errorf(chargeonce.EMETHOD, "%s is not allowed on %s", r.Method, r.URL.Path))
}

func (s *Server) handleCreateCharge(w http.ResponseWriter, r *http.Request) {
	merchant, err := s.keys.authenticate(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	key, err := idempotency.ParseKey(r.Header.Values("Idempotency-Key"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	body, err := s.readMerchantBody(w, r, merchant.ID)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	req, err := wire.DecodeChargeRequest(body)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	resp, err := s.engine.Charge(r.Context(), merchant.ID, key, &req)
	s.writeAttempt(w, r, resp, err)
}

// writeAttempt writes the engine's answer to one attempt of a money
// operation (a charge, a refund): the response, replayed or not, with
// Retry-After on a 202, or the problem err says.
func (s *Server) writeAttempt(w http.ResponseWriter, r *http.Request, resp engine.Response, err error) {
	if s.outcomes != nil {
		s.outcomes.Outcome(attemptStatus(resp, err), resp.Replayed)
	}
	s.writeAnswer(w, r, resp, err)
}

// writeOperationAttempt is writeAttempt for a refund, a capture or a
// cancel (kind): counted by its kind, never as a charge attempt.
func (s *Server) writeOperationAttempt(w http.ResponseWriter, r *http.Request, kind string, resp engine.Response, err error) {
	if o, ok := s.outcomes.(OperationOutcomeObserver); ok {
		o.OperationOutcome(kind, attemptStatus(resp, err), resp.Replayed)
	}
	s.writeAnswer(w, r, resp, err)
}

// attemptStatus is the HTTP status an attempt is answered.
func attemptStatus(resp engine.Response, err error) int {
	if err != nil {
		_, info := problemFor(err)
		return info.Status
	}
	return resp.Status
}

// writeAnswer writes an attempt's answer: the response or the problem.
func (s *Server) writeAnswer(w http.ResponseWriter, r *http.Request, resp engine.Response, err error) {
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	h := w.Header()
	// The constant headers of an answer are shared, never-written slices
	// (net/http only reads them): a replay allocates as little as it can.
	if resp.Status >= 400 {
		h["Content-Type"] = problemJSON
	} else {
		h["Content-Type"] = applicationJSON
	}
	if resp.Replayed {
		h["Idempotent-Replayed"] = replayedTrue
	}
	h["Content-Length"] = []string{strconv.Itoa(len(resp.Body))}
	if resp.Status == http.StatusAccepted || resp.RetryAfter > 0 {
		// A 202 always says when to come back (at least 1 s).
		h.Set("Retry-After", retryAfterHeader(resp.RetryAfter))
	}
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}

func (s *Server) handleGetCharge(w http.ResponseWriter, r *http.Request) {
	s.getOne(w, r, "charge", func(ctx context.Context, merchantID, id string) ([]byte, error) {
		ch, err := s.store.ChargeGet(ctx, merchantID, id)
		return engine.EncodeCharge(&ch), err
	})
}

// getOne answers GET of one of the merchant's objects (a charge, a
// refund) by the id in the path, read and encoded by get.
func (s *Server) getOne(w http.ResponseWriter, r *http.Request, what string, get func(ctx context.Context, merchantID, id string) ([]byte, error)) {
	merchant, err := s.keys.authenticate(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	id := r.PathValue("id")
	if !plausibleChargeID(id) {
		// An id no object can have (a NUL, invalid UTF-8, anything but
		// visible ASCII) is simply not found; it never reaches the store.
		s.writeError(w, r, chargeonce.Errorf(chargeonce.ENOTFOUND, "no %s has that id: ids are visible ASCII", what))
		return
	}
	body, err := get(r.Context(), merchant.ID, id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, body)
}

// HealthCheck reports whether r is a health check (GET /healthz or
// /readyz): the requests a listener's reserve of connections serves when
// every other connection is busy (httpserve.Config.Reserved).
func HealthCheck(r *http.Request) bool {
	return r.Method == http.MethodGet && (r.URL.Path == "/healthz" || r.URL.Path == "/readyz")
}

func (s *Server) handleHealthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, []byte(`{"status":"ok"}`))
}

// readyTimeout bounds the database ping of /readyz.
const readyTimeout = 2 * time.Second

func (s *Server) handleReadyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
	defer cancel()
	if err := s.store.Ping(ctx); err != nil {
		s.log.Warn("readiness check failed", "err", err)
		s.writeError(w, r, chargeonce.Errorf(chargeonce.EUNAVAILABLE, "the database is not reachable"))
		return
	}
	writeJSON(w, http.StatusOK, []byte(`{"status":"ready"}`))
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// The values of constant response headers (see handleCreateCharge).
var (
	applicationJSON = []string{"application/json"}
	problemJSON     = []string{"application/problem+json"}
	replayedTrue    = []string{"true"}
)

// readMerchantBody reads an authenticated request's body within the
// merchant's share of bodies arriving at once.
func (s *Server) readMerchantBody(w http.ResponseWriter, r *http.Request, merchant string) ([]byte, error) {
	release, err := s.bodies.take(r, merchant)
	if err != nil {
		return nil, err
	}
	defer release()
	return readBody(w, r)
}

// decodeMerchantBody reads an authenticated request's body within the
// merchant's share and decodes it strictly into v; on an error it answers
// the request and returns false.
func (s *Server) decodeMerchantBody(w http.ResponseWriter, r *http.Request, merchant string, v any) bool {
	body, err := s.readMerchantBody(w, r, merchant)
	if err == nil {
		err = wire.Decode(body, v)
	}
	if err != nil {
		s.writeError(w, r, err)
		return false
	}
	return true
}

// readBody reads a request body of at most MaxBodyBytes; a larger one is
// ETOOLARGE.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if r.ContentLength > MaxBodyBytes {
		return nil, wire.TooLarge()
	}
	if n := r.ContentLength; n > 0 {
		// The common case, a declared length: one buffer of that size
		// (and a byte more, to see a body longer than it said).
		buf := make([]byte, n+1)
		got, err := io.ReadFull(r.Body, buf)
		switch {
		case errors.Is(err, io.ErrUnexpectedEOF) && int64(got) == n:
			return buf[:n], nil
		case err == nil:
			return nil, chargeonce.Errorf(chargeonce.EINVALID, "the body is longer than its Content-Length")
		default:
			return nil, chargeonce.Errorf(chargeonce.EINVALID, "the body could not be read: %v", err)
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, wire.TooLarge()
		}
		return nil, chargeonce.Errorf(chargeonce.EINVALID, "the body could not be read: %v", err)
	}
	return body, nil
}
