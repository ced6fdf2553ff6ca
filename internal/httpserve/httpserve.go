// Package httpserve is the one way chargeonce serves HTTP: every listener
// (the API, the metrics listener, `chargeonce acquirer`) gets the same
// header size limit, timeouts and connection cap, so that a client holding
// connections open, sending huge or endless headers, or opening thousands of
// idle connections cannot exhaust memory or file descriptors and stop
// /healthz and other clients from being served (SPEC "Tenants share the
// service fairly").
package httpserve

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// The limits every listener applies. Go's own defaults (1 MiB of headers, no
// read, write or idle timeout beyond the caller's) let 600 connections with
// ~1 MB of unfinished headers hold 650 MB.
const (
	// MaxHeaderBytes bounds the request line and headers; a larger request
	// is answered 431. chargeonce's requests carry a few hundred bytes.
	MaxHeaderBytes = 8 << 10
	// ReadHeaderTimeout bounds how long a client may take to send its
	// request line and headers (slow headers).
	ReadHeaderTimeout = 5 * time.Second
	// ReadTimeout bounds reading a whole request, body included (at most
	// 64 KiB on the API).
	ReadTimeout = 30 * time.Second
	// DefaultWriteTimeout bounds a request from the end of its headers to
	// the end of its answer, unless Config.WriteTimeout asks for longer.
	DefaultWriteTimeout = 60 * time.Second
	// IdleTimeout is how long a keep-alive connection may wait for its next
	// request.
	IdleTimeout = 30 * time.Second
	// DefaultMaxConns is --max-conns's default.
	DefaultMaxConns = 4096
	// fdReserve is how many file descriptors the cap leaves to everything
	// else a process opens (database connections, NATS, log files).
	fdReserve = 256
	// minMaxConns is the smallest cap the descriptor limit can lower it to.
	minMaxConns = 64
)

// Config describes one listener.
type Config struct {
	// Name labels the listener in logs and metrics: "api", "metrics",
	// "acquirer".
	Name    string
	Handler http.Handler
	Logger  *slog.Logger
	// MaxConns caps the open connections (DefaultMaxConns when 0); it is
	// lowered to fit the process's file descriptor limit.
	MaxConns int
	// WriteTimeout, when longer than DefaultWriteTimeout, replaces it: a
	// handler that may legitimately take longer (an acquirer call, a slow
	// simulated capture) must still be able to answer.
	WriteTimeout time.Duration
	// Reserve is how many of MaxConns are kept for the requests Reserved
	// approves (DefaultReserve when 0 and Reserved is set; none without
	// Reserved): once the other connections are all busy, a new connection
	// is admitted into the reserve, where any other request is answered
	// 503 without its body being read, and the connection closed. Slow
	// clients by the thousand then never stop /healthz or a signed-in
	// operator from being served.
	Reserve int
	// Reserved reports whether r may be served on a reserve connection. It
	// must be cheap and must not read the body.
	Reserved func(r *http.Request) bool
	// TLS, when set, serves HTTPS with it (its Certificates or
	// GetCertificate).
	TLS *tls.Config
}

// DefaultReserve is Config.Reserve's default.
const DefaultReserve = 64

// reserveKey marks the context of a request that arrived on a reserve
// connection.
type reserveKey struct{}

// Server is an http.Server with chargeonce's limits and a connection cap.
type Server struct {
	// HTTP is the underlying server, its limits set.
	HTTP  *http.Server
	conns *Limiter
	log   *slog.Logger
	name  string
}

// New returns a Server for cfg.
func New(cfg Config) *Server {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	maxConns := cfg.MaxConns
	if maxConns <= 0 {
		maxConns = DefaultMaxConns
	}
	if fit := FitDescriptors(maxConns); fit < maxConns {
		log.Warn("connection cap lowered to fit the file descriptor limit", "listener", cfg.Name, "max_conns", maxConns, "lowered_to", fit)
		maxConns = fit
	}
	reserve := 0
	handler := cfg.Handler
	if cfg.Reserved != nil {
		reserve = cfg.Reserve
		if reserve <= 0 {
			reserve = DefaultReserve
		}
		handler = reserved(handler, cfg.Reserved)
	}
	conns := NewLimiterReserve(maxConns, min(reserve, maxConns/2))
	return &Server{
		HTTP: &http.Server{
			Handler:           guardBody(handler),
			TLSConfig:         cfg.TLS,
			ConnContext:       connContext,
			MaxHeaderBytes:    MaxHeaderBytes,
			ReadHeaderTimeout: ReadHeaderTimeout,
			ReadTimeout:       ReadTimeout,
			WriteTimeout:      max(DefaultWriteTimeout, cfg.WriteTimeout),
			IdleTimeout:       IdleTimeout,
			ConnState:         conns.track,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		},
		conns: conns,
		log:   log,
		name:  cfg.Name,
	}
}

// Serve serves on ln, capped, until Shutdown or Close.
func (s *Server) Serve(ln net.Listener) error {
	if s.HTTP.TLSConfig != nil {
		return s.HTTP.ServeTLS(s.conns.Listener(ln), "", "")
	}
	return s.HTTP.Serve(s.conns.Listener(ln))
}

// connContext marks the requests of a reserve connection.
func connContext(ctx context.Context, c net.Conn) context.Context {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if _, ok := c.(*reservedConn); ok {
		return context.WithValue(ctx, reserveKey{}, true)
	}
	return ctx
}

// reserveRefusal answers a request the reserve is not kept for.
const reserveRefusal = "the server is busy; retry\n"

// reserved serves, on a reserve connection, only the requests ok approves.
func reserved(h http.Handler, ok func(*http.Request) bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if in, _ := r.Context().Value(reserveKey{}).(bool); in && !ok(r) {
			w.Header().Set("Connection", "close")
			w.Header().Set("Retry-After", "1")
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(reserveRefusal))
			return
		}
		h.ServeHTTP(w, r)
	})
}

// Shutdown stops accepting and waits for requests in flight (see
// http.Server.Shutdown).
func (s *Server) Shutdown(ctx context.Context) error { return s.HTTP.Shutdown(ctx) }

// Close closes the listener and every connection at once.
func (s *Server) Close() error { return s.HTTP.Close() }

// Stats returns the listener's connection statistics.
func (s *Server) Stats() Stats { return s.conns.Stats() }

// Name is the listener's name.
func (s *Server) Name() string { return s.name }
