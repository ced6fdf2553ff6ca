package bench

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/idempotency"
	"github.com/chargeonce/chargeonce/postgres"
	"github.com/chargeonce/chargeonce/sqlite"
)

// The values the bare handler writes where chargeonce writes a computed one:
// no fingerprint is computed and no lease or expiry is configured, but the
// rows are as wide as chargeonce's.
const (
	bareFingerprint = "bare-handler-computes-no-fingerprint-000000" // as long as a real one
	bareLease       = 30 * time.Second
	bareTTL         = 24 * time.Hour
)

// conflictBody is what the bare handler answers for a key that another
// request is still processing.
var conflictBody = []byte(`{"status":409}`)

// core runs the statements of one POST /v1/charges, as the bare handler and
// the raw-SQL way do: the store's insert-first statement; when it inserted,
// the acquirer and the store's completion statement; otherwise the stored
// response, or 409 while there is none. There is nothing else: no
// fingerprint, no token check, no validation, no lease or expiry handling.
type core interface {
	charge(ctx context.Context, key string, req *chargeRequest) (status int, body []byte, err error)
}

// ids makes charge ids and tokens shaped like chargeonce's: random, so
// that the charges' primary key grows as chargeonce's does (inserts land all
// over the index, not at its end), but from a fast non-cryptographic source:
// the bare handler has no security to keep.
type ids struct{}

func newIDs() *ids { return &ids{} }

// next returns a charge id shaped and ordered like chargeonce's
// (idempotency.NewChargeID: time-ordered, then random) and a token (32 hex).
func (*ids) next() (id, token string) {
	var raw [16]byte
	// The bare handler's tokens guard nothing: a fast non-cryptographic
	// source is what keeps it a floor.
	binary.LittleEndian.PutUint64(raw[0:], rand.Uint64()) //nolint:gosec // G404: see above
	binary.LittleEndian.PutUint64(raw[8:], rand.Uint64()) //nolint:gosec // G404: see above
	return idempotency.NewChargeID(), hex.EncodeToString(raw[:])
}

// bareResponse renders the charge object the way a minimal handler would.
func bareResponse(id string, r *chargeRequest, status chargeonce.Status) []byte {
	b := make([]byte, 0, 192)
	b = append(b, `{"id":"`...)
	b = append(b, id...)
	b = append(b, `","order_id":`...)
	b = strconv.AppendInt(b, r.OrderID, 10)
	b = append(b, `,"amount_cents":`...)
	b = strconv.AppendInt(b, r.AmountCents, 10)
	b = append(b, `,"currency":"`...)
	b = append(b, r.Currency...)
	b = append(b, `","status":"`...)
	b = append(b, status...)
	b = append(b, `","decline_code":null,"created_at":"`...)
	b = time.Now().UTC().AppendFormat(b, time.RFC3339)
	return append(b, `"}`...)
}

// capture calls the simulator as chargeonce does, and builds the answer.
func capture(ctx context.Context, sim *acquirer.Simulator, id string, req *chargeRequest) (status int, body []byte, res chargeonce.CaptureResult, err error) {
	res, err = sim.Capture(ctx, chargeonce.CaptureRequest{
		Reference: id, OrderID: req.OrderID, Merchant: merchant,
		AmountCents: req.AmountCents, Currency: req.Currency, PaymentToken: req.PaymentToken,
	})
	if err != nil {
		return 0, nil, res, fmt.Errorf("capturing: %w", err)
	}
	status = http.StatusCreated
	if res.Status != chargeonce.StatusCaptured {
		status = http.StatusPaymentRequired
	}
	return status, bareResponse(id, req, res.Status), res, nil
}

// pgCore runs postgres.Statements on a pool as large as the store's.
type pgCore struct {
	pool *pgxpool.Pool
	sim  *acquirer.Simulator
	ids  *ids
}

// stored is what the bare handler reads of an existing record.
type stored struct {
	inserted  bool
	completed bool
	status    int
	body      []byte
}

// readPGRecord reads the columns it needs from the first row, by name and
// without decoding the rest; found=false when there is no row.
func readPGRecord(rows pgx.Rows, withInserted bool) (rec stored, found bool, err error) {
	defer rows.Close()
	if !rows.Next() {
		return stored{}, false, rows.Err()
	}
	vals := rows.RawValues()
	for i, fd := range rows.FieldDescriptions() {
		v := vals[i]
		switch {
		case i == 0 && withInserted:
			rec.inserted = len(v) == 1 && (v[0] == 1 || v[0] == 't')
		case fd.Name == "state":
			rec.completed = string(v) == string(chargeonce.KeyCompleted)
		case fd.Name == "response_status" && v != nil:
			if fd.Format == pgx.BinaryFormatCode && len(v) == 4 {
				rec.status = int(int32(binary.BigEndian.Uint32(v))) //nolint:gosec // G115: an int4 column, reinterpreted bit for bit as PostgreSQL sends it
			} else {
				rec.status, _ = strconv.Atoi(string(v))
			}
		case fd.Name == "response_body":
			rec.body = bytes.Clone(v)
		}
	}
	rows.Close()
	return rec, true, rows.Err()
}

func (c *pgCore) charge(ctx context.Context, key string, req *chargeRequest) (int, []byte, error) {
	id, token := c.ids.next()
	rows, err := c.pool.Query(ctx, postgres.Statements.KeyInsert,
		merchant, key, bareFingerprint, token, bareLease, id,
		req.OrderID, req.AmountCents, req.Currency, req.PaymentToken, req.Description, nil)
	if err != nil {
		return 0, nil, fmt.Errorf("inserting key: %w", err)
	}
	rec, found, err := readPGRecord(rows, true)
	if err != nil {
		return 0, nil, fmt.Errorf("inserting key: %w", err)
	}
	if !found {
		// Taken by a record this statement's snapshot could not see: read
		// it again, as the store does.
		rows, err := c.pool.Query(ctx, postgres.Statements.KeyGet, merchant, key)
		if err != nil {
			return 0, nil, fmt.Errorf("reading key: %w", err)
		}
		if rec, found, err = readPGRecord(rows, false); err != nil {
			return 0, nil, fmt.Errorf("reading key: %w", err)
		}
		if !found {
			return http.StatusConflict, conflictBody, nil
		}
	}
	if !rec.inserted {
		if rec.completed {
			return rec.status, rec.body, nil
		}
		return http.StatusConflict, conflictBody, nil
	}
	status, body, res, err := capture(ctx, c.sim, id, req)
	if err != nil {
		return 0, nil, err
	}
	var n int
	if err := c.pool.QueryRow(ctx, postgres.Statements.KeyComplete,
		merchant, key, token, status, body, string(res.Status), res.DeclineCode, bareTTL,
		string(chargeonce.KeyProcessing)).Scan(&n); err != nil {
		return 0, nil, fmt.Errorf("completing key: %w", err)
	}
	return status, body, nil
}

// sqliteCore runs sqlite.Statements on the store's own pools: one write
// connection for every write transaction, a read pool beside it.
type sqliteCore struct {
	wdb                       *sql.DB
	insert, chargeInsert, sel *sql.Stmt
	complete, chargeComplete  *sql.Stmt
	sim                       *acquirer.Simulator
	ids                       *ids
	leaseMicros, ttlMicros    int64
}

func newSQLiteCore(ctx context.Context, s *sqlite.Store, sim *acquirer.Simulator) (*sqliteCore, error) {
	wdb, _ := s.DBs()
	c := &sqliteCore{wdb: wdb, sim: sim, ids: newIDs(), leaseMicros: bareLease.Microseconds(), ttlMicros: bareTTL.Microseconds()}
	var err error
	prep := func(dst **sql.Stmt, q string) {
		if err == nil {
			*dst, err = wdb.PrepareContext(ctx, q)
		}
	}
	st := sqlite.Statements
	prep(&c.insert, st.KeyInsert)
	prep(&c.chargeInsert, st.ChargeInsert)
	prep(&c.sel, st.KeySelect)
	prep(&c.complete, st.KeyComplete)
	prep(&c.chargeComplete, st.ChargeComplete)
	if err != nil {
		return nil, fmt.Errorf("preparing statements: %w", err)
	}
	return c, nil
}

func (c *sqliteCore) charge(ctx context.Context, key string, req *chargeRequest) (int, []byte, error) {
	id, token := c.ids.next()
	tx, err := c.wdb.BeginTx(ctx, nil)
	if err != nil {
		return 0, nil, fmt.Errorf("beginning: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	var createdAt, leaseUntil int64
	var leaseExpired bool
	err = tx.StmtContext(ctx, c.insert).QueryRowContext(ctx,
		merchant, key, bareFingerprint, token, c.leaseMicros, id,
	).Scan(&createdAt, &leaseUntil, &leaseExpired)
	if errors.Is(err, sql.ErrNoRows) {
		rec, err := readSQLiteRecord(tx.StmtContext(ctx, c.sel).QueryContext(ctx, merchant, key))
		if err != nil {
			return 0, nil, fmt.Errorf("reading key: %w", err)
		}
		if err := tx.Commit(); err != nil {
			return 0, nil, fmt.Errorf("committing: %w", err)
		}
		if rec.completed {
			return rec.status, rec.body, nil
		}
		return http.StatusConflict, conflictBody, nil
	}
	if err != nil {
		return 0, nil, fmt.Errorf("inserting key: %w", err)
	}
	if _, err := tx.StmtContext(ctx, c.chargeInsert).ExecContext(ctx,
		id, merchant, key, req.OrderID, req.AmountCents, req.Currency, req.PaymentToken, req.Description, createdAt, chargeonce.MetadataText(req.Metadata),
	); err != nil {
		return 0, nil, fmt.Errorf("inserting charge: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return 0, nil, fmt.Errorf("committing: %w", err)
	}

	status, body, res, err := capture(ctx, c.sim, id, req)
	if err != nil {
		return 0, nil, err
	}
	tx, err = c.wdb.BeginTx(ctx, nil)
	if err != nil {
		return 0, nil, fmt.Errorf("beginning: %w", err)
	}
	var chargeID string
	if err := tx.StmtContext(ctx, c.complete).QueryRowContext(ctx, merchant, key, token, status, body, c.ttlMicros).Scan(&chargeID); err != nil {
		return 0, nil, fmt.Errorf("completing key: %w", err)
	}
	if _, err := tx.StmtContext(ctx, c.chargeComplete).ExecContext(ctx, chargeID, string(res.Status), res.DeclineCode); err != nil {
		return 0, nil, fmt.Errorf("completing charge: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return 0, nil, fmt.Errorf("committing: %w", err)
	}
	return status, body, nil
}

// readSQLiteRecord reads the columns it needs from the first row, by name,
// as raw bytes.
func readSQLiteRecord(rows *sql.Rows, err error) (stored, error) {
	if err != nil {
		return stored{}, err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return stored{}, err
		}
		return stored{}, errors.New("the conflicting record is gone")
	}
	cols, err := rows.Columns()
	if err != nil {
		return stored{}, err
	}
	raw := make([]sql.RawBytes, len(cols))
	dest := make([]any, len(cols))
	for i := range raw {
		dest[i] = &raw[i]
	}
	if err := rows.Scan(dest...); err != nil {
		return stored{}, err
	}
	var rec stored
	for i, name := range cols {
		switch name {
		case "state":
			rec.completed = string(raw[i]) == string(chargeonce.KeyCompleted)
		case "response_status":
			rec.status, _ = strconv.Atoi(string(raw[i]))
		case "response_body":
			rec.body = bytes.Clone(raw[i])
		}
	}
	return rec, rows.Close()
}

// bareHandler is the minimal net/http handler: decode the body, run the
// statements, write the answer. No auth, no key parsing, no validation.
func bareHandler(c core, log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/charges", func(w http.ResponseWriter, r *http.Request) {
		var req chargeRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		status, body, err := c.charge(r.Context(), r.Header.Get("Idempotency-Key"), &req)
		if err != nil {
			log.Error("bare handler failed", "err", err)
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write(body)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"status":"ok"}`)
	})
	return mux
}

// openCore opens (and migrates) the store named by db and returns the core
// that runs its statements, with a simulator of its own.
func openCore(ctx context.Context, db string) (chargeonce.Store, core, *acquirer.Simulator, error) {
	sim := acquirer.NewSimulator(acquirer.Options{})
	store, err := openStore(ctx, db)
	if err != nil {
		sim.Close()
		return nil, nil, nil, err
	}
	var c core
	switch s := store.(type) {
	case *postgres.Store:
		c = &pgCore{pool: s.Pool(), sim: sim, ids: newIDs()}
	case *sqlite.Store:
		c, err = newSQLiteCore(ctx, s, sim)
	}
	if err != nil {
		store.Close()
		sim.Close()
		return nil, nil, nil, err
	}
	return store, c, sim, nil
}

// openStore opens and migrates the store named by db: a postgres:// URL
// (with a pool of postgres.DefaultMaxConns, as `serve` has) or sqlite:PATH.
func openStore(ctx context.Context, db string) (chargeonce.Store, error) {
	var (
		s   chargeonce.Store
		err error
	)
	if isPostgres(db) {
		s, err = postgres.Open(ctx, db)
	} else {
		s, err = sqlite.Open(ctx, strings.TrimPrefix(db, "sqlite:"))
	}
	if err != nil {
		return nil, err
	}
	if err := s.Migrate(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// ServeBare runs the bare-HTTP server on addr over db until ctx ends.
func ServeBare(ctx context.Context, addr, db string, log *slog.Logger) error {
	store, c, sim, err := openCore(ctx, db)
	if err != nil {
		return fmt.Errorf("--db: %w", err)
	}
	defer store.Close()
	defer sim.Close()
	return serveCore(ctx, addr, c, log)
}

// serveCore serves c behind the bare handler on addr until ctx ends.
func serveCore(ctx context.Context, addr string, c core, log *slog.Logger) error {
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("--addr: %w", err)
	}
	srv := &http.Server{
		Handler:           bareHandler(c, log),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       120 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	return serveUntil(ctx, srv, ln)
}

// serveUntil serves on ln until ctx ends, then shuts srv down.
func serveUntil(ctx context.Context, srv *http.Server, ln net.Listener) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serving: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("shutting down: %w", err)
	}
	return nil
}
