// Package apitest starts real chargeonce instances for tests: a store on a
// real database (PostgreSQL from pgtest, or an SQLite file), the engine, and
// the HTTP API on a loopback listener.
package apitest

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/httpapi"
	"github.com/chargeonce/chargeonce/internal/pgtest"
	"github.com/chargeonce/chargeonce/postgres"
	"github.com/chargeonce/chargeonce/replaycache"
	"github.com/chargeonce/chargeonce/sqlite"
)

// APIKey is the key of merchant "demo" in every test instance; OtherAPIKey
// belongs to merchant "other".
const (
	APIKey      = "sk_test_demo"
	OtherAPIKey = "sk_test_other"
	keySpec     = "demo:" + APIKey + ",other:" + OtherAPIKey
)

// PostgresStoreAt opens (and migrates) a store on url, closed at cleanup.
func PostgresStoreAt(t testing.TB, url string) *postgres.Store {
	t.Helper()
	ctx := context.Background()
	s, err := postgres.Open(ctx, url)
	if err != nil {
		t.Fatalf("opening postgres store: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("migrating postgres store: %v", err)
	}
	return s
}

// SQLiteStore opens a migrated store in a new file in t.TempDir().
func SQLiteStore(t testing.TB) *sqlite.Store {
	t.Helper()
	ctx := context.Background()
	s, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "chargeonce.db"))
	if err != nil {
		t.Fatalf("opening sqlite store: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("migrating sqlite store: %v", err)
	}
	return s
}

// Store returns a fresh store of the given kind ("postgres" or "sqlite").
func Store(t testing.TB, kind string) chargeonce.Store {
	t.Helper()
	switch kind {
	case "postgres":
		return PostgresStoreAt(t, pgtest.URL(t))
	case "sqlite":
		return SQLiteStore(t)
	}
	t.Fatalf("unknown store kind %q", kind)
	return nil
}

// Simulator returns an in-process acquirer simulator, closed at cleanup.
func Simulator(t testing.TB, opts acquirer.Options) *acquirer.Simulator {
	t.Helper()
	sim := acquirer.NewSimulator(opts)
	t.Cleanup(func() { sim.Close() })
	return sim
}

// Instance is one running chargeonce API.
type Instance struct {
	URL    string
	Engine *engine.Engine
	Store  chargeonce.Store
	// Replays is the replay cache in front of the engine, as serve has it.
	Replays *replaycache.Store
	Server  *httptest.Server
}

// Start runs the API over store and acq on a loopback listener, wired as
// `chargeonce serve` wires it (cmd/chargeonce/serve.go): the engine goes
// through a replay cache, while the API's reads use the store itself.
func Start(t testing.TB, store chargeonce.Store, acq chargeonce.Acquirer, opts engine.Options) *Instance {
	t.Helper()
	keys, err := httpapi.ParseKeys(keySpec)
	if err != nil {
		t.Fatal(err)
	}
	replays := replaycache.New(store, replaycache.Options{})
	eng := engine.New(replays, acq, opts)
	srv := httptest.NewServer(httpapi.New(httpapi.Config{Engine: eng, Store: store, Keys: keys}))
	t.Cleanup(srv.Close)
	return &Instance{URL: srv.URL, Engine: eng, Store: store, Replays: replays, Server: srv}
}

// Result is a finished HTTP exchange.
type Result struct {
	Status int
	Header http.Header
	Body   []byte
}

// Do sends one request with the demo API key (unless headers override it)
// and reads the whole answer. The request is bound to t's context: it is
// cancelled when the test ends.
func Do(t testing.TB, c *http.Client, method, url string, body []byte, headers map[string]string) (Result, error) {
	t.Helper()
	if c == nil {
		c = http.DefaultClient
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, url, rd)
	if err != nil {
		return Result{}, err
	}
	req.Header.Set("Authorization", "Bearer "+APIKey)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range headers {
		if v == "" {
			req.Header.Del(k)
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		return Result{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return Result{}, err
	}
	return Result{Status: resp.StatusCode, Header: resp.Header, Body: b}, nil
}

// Charge posts a charge with key and the demo API key, failing the test on
// a transport error.
func Charge(t testing.TB, baseURL, key, body string) Result {
	t.Helper()
	r, err := Do(t, nil, "POST", baseURL+"/v1/charges", []byte(body), map[string]string{"Idempotency-Key": key})
	if err != nil {
		t.Fatalf("POST /v1/charges: %v", err)
	}
	return r
}

// Eventually polls cond every 10ms until it holds or d passes.
func Eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Buffer is a bytes.Buffer that a server's (or a command's) goroutines may
// write while the test reads it: for logs under test.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write implements io.Writer.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
