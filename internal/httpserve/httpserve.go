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
}

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
	conns := NewLimiter(maxConns)
	return &Server{
		HTTP: &http.Server{
			Handler:           cfg.Handler,
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
	return s.HTTP.Serve(s.conns.Listener(ln))
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
