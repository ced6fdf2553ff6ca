// Package httpapi is chargeonce's HTTP API (SPEC "HTTP API"): handlers,
// bearer authentication, request limits and problem+json errors.
package httpapi

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
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
	// WebhooksRate is each merchant's rate on the webhook and event routes
	// (429 over it); DefaultWebhooksRate when zero.
	WebhooksRate engine.Rate
}

// New returns a Server.
func New(cfg Config) *Server {
	s := &Server{engine: cfg.Engine, store: cfg.Store, keys: cfg.Keys, log: cfg.Logger, outcomes: cfg.Outcomes, rejected: cfg.Rejections, mux: http.NewServeMux(),
		webhooksAllowPrivate: cfg.WebhooksAllowPrivate, webhookRate: &webhookLimits{shape: cfg.WebhooksRate}}
	s.tester = webhook.NewTester(cfg.WebhooksAllowPrivate)
	if s.webhookRate.shape.IsZero() {
		s.webhookRate.shape = DefaultWebhooksRate
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.mux.HandleFunc("POST /v1/charges", s.handleCreateCharge)
	s.mux.HandleFunc("GET /v1/charges", s.handleListCharges)
	s.mux.HandleFunc("GET /v1/charges/{id}", s.handleGetCharge)
	s.mux.HandleFunc("/v1/charges", s.methodNotAllowed)
	s.mux.HandleFunc("/v1/charges/{id}", s.methodNotAllowed)
	s.routeWebhooks()
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
	s.mux.ServeHTTP(w, withRequestID(w, r))
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
	body, err := readBody(w, r)
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
	if s.outcomes != nil {
		status := resp.Status
		if err != nil {
			_, info := problemFor(err)
			status = info.Status
		}
		s.outcomes.Outcome(status, resp.Replayed)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	h := w.Header()
	h.Set("Content-Type", resp.ContentType())
	if resp.Replayed {
		h.Set("Idempotent-Replayed", "true")
	}
	if resp.Status == http.StatusAccepted || resp.RetryAfter > 0 {
		// A 202 always says when to come back (at least 1 s).
		h.Set("Retry-After", retryAfterHeader(resp.RetryAfter))
	}
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}

func (s *Server) handleGetCharge(w http.ResponseWriter, r *http.Request) {
	merchant, err := s.keys.authenticate(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	id := r.PathValue("id")
	if !plausibleChargeID(id) {
		// An id no charge can have (a NUL, invalid UTF-8, anything but
		// visible ASCII) is simply not found; it never reaches the store.
		s.writeError(w, r, chargeonce.Errorf(chargeonce.ENOTFOUND, "no charge has that id: ids are visible ASCII"))
		return
	}
	ch, err := s.store.ChargeGet(r.Context(), merchant.ID, id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, engine.EncodeCharge(&ch))
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

// readBody reads a request body of at most MaxBodyBytes; a larger one is
// ETOOLARGE.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if r.ContentLength > MaxBodyBytes {
		return nil, wire.TooLarge()
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
