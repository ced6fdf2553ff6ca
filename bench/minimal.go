package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/postgres"
	"github.com/chargeonce/chargeonce/sqlite"
)

// The minimal way is the seed article's design, the least any insert-first
// service can write: one table, cobranca, with a UNIQUE idempotency key, and
// two autocommit statements per charge — INSERT … ON CONFLICT DO NOTHING
// RETURNING, then an UPDATE with the acquirer's answer. No lease, no token,
// no fingerprint, no merchant scope, no charge kept apart from its key. It
// is the design-independent floor that chargeonce's own statements are held
// against (new_vs_minimal, contended_vs_minimal), where bare-http only shows
// what chargeonce's Go code adds on top of its own statements.
//
// The article's status words are kept: PROCESSANDO, CAPTURADA, RECUSADA.
const (
	minimalDDLPostgres = `
CREATE TABLE IF NOT EXISTS cobranca (
    id              BIGSERIAL    PRIMARY KEY,
    idempotency_key VARCHAR(255) NOT NULL UNIQUE,
    pedido_id       BIGINT       NOT NULL,
    valor_centavos  BIGINT       NOT NULL,
    status          VARCHAR(20)  NOT NULL,
    resposta        TEXT,
    criado_em       TIMESTAMPTZ  NOT NULL DEFAULT now()
)`
	minimalDDLSQLite = `
CREATE TABLE IF NOT EXISTS cobranca (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key TEXT    NOT NULL UNIQUE,
    pedido_id       INTEGER NOT NULL,
    valor_centavos  INTEGER NOT NULL,
    status          TEXT    NOT NULL,
    resposta        TEXT,
    criado_em       INTEGER NOT NULL DEFAULT (unixepoch())
)`
	minimalInsertPG = `INSERT INTO cobranca (idempotency_key, pedido_id, valor_centavos, status)
VALUES ($1, $2, $3, 'PROCESSANDO')
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING id`
	minimalSelectPG = `SELECT status, resposta FROM cobranca WHERE idempotency_key = $1`
	minimalUpdatePG = `UPDATE cobranca SET status = $2, resposta = $3 WHERE id = $1`

	minimalInsertSQLite = `INSERT INTO cobranca (idempotency_key, pedido_id, valor_centavos, status)
VALUES (?, ?, ?, 'PROCESSANDO')
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING id`
	minimalSelectSQLite = `SELECT status, resposta FROM cobranca WHERE idempotency_key = ?`
	minimalUpdateSQLite = `UPDATE cobranca SET status = ?, resposta = ? WHERE id = ?`
)

// minimalStatus is the article's word for a charge's status.
func minimalStatus(s chargeonce.Status) string {
	if s == chargeonce.StatusCaptured {
		return "CAPTURADA"
	}
	return "RECUSADA"
}

// minimalAnswer is what the minimal design answers for a stored row.
func minimalAnswer(status string, body []byte) (int, []byte) {
	switch status {
	case "CAPTURADA":
		return http.StatusCreated, body
	case "RECUSADA":
		return http.StatusPaymentRequired, body
	default:
		return http.StatusConflict, conflictBody
	}
}

// minimalPG runs the minimal design on PostgreSQL, on a pool as large as
// the store's.
type minimalPG struct {
	pool *pgxpool.Pool
	sim  *acquirer.Simulator
	ids  *ids
}

func (c *minimalPG) charge(ctx context.Context, key string, req *chargeRequest) (int, []byte, error) {
	var id int64
	err := c.pool.QueryRow(ctx, minimalInsertPG, key, req.OrderID, req.AmountCents).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		var (
			status string
			body   *string
		)
		if err := c.pool.QueryRow(ctx, minimalSelectPG, key).Scan(&status, &body); err != nil {
			return 0, nil, fmt.Errorf("reading cobranca: %w", err)
		}
		if body == nil {
			return http.StatusConflict, conflictBody, nil
		}
		st, b := minimalAnswer(status, []byte(*body))
		return st, b, nil
	}
	if err != nil {
		return 0, nil, fmt.Errorf("inserting cobranca: %w", err)
	}
	ref, _ := c.ids.next()
	status, body, res, err := capture(ctx, c.sim, ref, req)
	if err != nil {
		return 0, nil, err
	}
	if _, err := c.pool.Exec(ctx, minimalUpdatePG, id, minimalStatus(res.Status), string(body)); err != nil {
		return 0, nil, fmt.Errorf("updating cobranca: %w", err)
	}
	return status, body, nil
}

// minimalSQLite runs the minimal design on SQLite through the store's one
// write connection, with the store's durability settings.
type minimalSQLite struct {
	wdb                 *sql.DB
	insert, sel, update *sql.Stmt
	sim                 *acquirer.Simulator
	ids                 *ids
}

func (c *minimalSQLite) charge(ctx context.Context, key string, req *chargeRequest) (int, []byte, error) {
	var id int64
	err := c.insert.QueryRowContext(ctx, key, req.OrderID, req.AmountCents).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		var (
			status string
			body   sql.NullString
		)
		if err := c.sel.QueryRowContext(ctx, key).Scan(&status, &body); err != nil {
			return 0, nil, fmt.Errorf("reading cobranca: %w", err)
		}
		if !body.Valid {
			return http.StatusConflict, conflictBody, nil
		}
		st, b := minimalAnswer(status, []byte(body.String))
		return st, b, nil
	}
	if err != nil {
		return 0, nil, fmt.Errorf("inserting cobranca: %w", err)
	}
	ref, _ := c.ids.next()
	status, body, res, err := capture(ctx, c.sim, ref, req)
	if err != nil {
		return 0, nil, err
	}
	if _, err := c.update.ExecContext(ctx, minimalStatus(res.Status), string(body), id); err != nil {
		return 0, nil, fmt.Errorf("updating cobranca: %w", err)
	}
	return status, body, nil
}

// openMinimal opens db as the store does (same pool size, same SQLite
// pragmas), creates the cobranca table and returns the minimal core.
func openMinimal(ctx context.Context, db string) (chargeonce.Store, core, *acquirer.Simulator, error) {
	sim := acquirer.NewSimulator(acquirer.Options{})
	store, err := openStore(ctx, db)
	if err != nil {
		sim.Close()
		return nil, nil, nil, err
	}
	fail := func(err error) (chargeonce.Store, core, *acquirer.Simulator, error) {
		store.Close()
		sim.Close()
		return nil, nil, nil, err
	}
	switch s := store.(type) {
	case *postgres.Store:
		if _, err := s.Pool().Exec(ctx, minimalDDLPostgres); err != nil {
			return fail(fmt.Errorf("creating cobranca: %w", err))
		}
		return store, &minimalPG{pool: s.Pool(), sim: sim, ids: newIDs()}, sim, nil
	case *sqlite.Store:
		wdb, _ := s.DBs()
		if _, err := wdb.ExecContext(ctx, minimalDDLSQLite); err != nil {
			return fail(fmt.Errorf("creating cobranca: %w", err))
		}
		c := &minimalSQLite{wdb: wdb, sim: sim, ids: newIDs()}
		for _, p := range []struct {
			dst **sql.Stmt
			q   string
		}{{&c.insert, minimalInsertSQLite}, {&c.sel, minimalSelectSQLite}, {&c.update, minimalUpdateSQLite}} {
			if *p.dst, err = wdb.PrepareContext(ctx, p.q); err != nil {
				return fail(fmt.Errorf("preparing %q: %w", strings.Fields(p.q)[0], err))
			}
		}
		return store, c, sim, nil
	default:
		return fail(fmt.Errorf("the minimal way has no design for %T", store))
	}
}

// ServeMinimal runs the minimal design behind the bare handler on addr over
// db until ctx ends.
func ServeMinimal(ctx context.Context, addr, db string, log *slog.Logger) error {
	store, c, sim, err := openMinimal(ctx, db)
	if err != nil {
		return fmt.Errorf("--db: %w", err)
	}
	defer store.Close()
	defer sim.Close()
	return serveCore(ctx, addr, c, log)
}
