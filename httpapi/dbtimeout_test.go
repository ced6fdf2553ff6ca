package httpapi_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/internal/pgtest"
)

// TestDatabaseTimeoutsAre503: a statement the database cancels for taking
// too long (statement_timeout, SQLSTATE 57014) or for waiting too long on a
// lock (lock_timeout, 55P03) says nothing is wrong with the request: the
// answer is 503 unavailable with Retry-After, on the reads and on a new
// charge, never 500.
func TestDatabaseTimeoutsAre503(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, params string }{
		{"statement_timeout", "&statement_timeout=300ms"},
		{"lock_timeout", "&lock_timeout=300ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			base := pgtest.URL(t)
			store := apitest.PostgresStoreAt(t, base+tc.params)
			sim := apitest.Simulator(t, acquirer.Options{})
			inst := apitest.Start(t, store, sim, engine.Options{})

			order := orderSeq.Add(1)
			created := apitest.Charge(t, inst.URL, "k-before", chargeBody(order, "tok_ok"))
			if created.Status != 201 {
				t.Fatalf("charge before the lock: %d %s", created.Status, created.Body)
			}
			id := decodeCharge(t, created.Body).ID

			// Another session holds both tables: every statement of the
			// store waits on it until its timeout.
			ctx := t.Context()
			locker, err := pgx.Connect(ctx, base)
			if err != nil {
				t.Fatal(err)
			}
			defer locker.Close(context.Background())
			tx, err := locker.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(context.Background()) }() // ends the lock
			if _, err := tx.Exec(ctx, "LOCK TABLE charges, idempotency_keys IN ACCESS EXCLUSIVE MODE"); err != nil {
				t.Fatal(err)
			}

			for _, req := range []struct{ method, path, key, body string }{
				{"GET", "/v1/charges/" + id, "", ""},
				{"GET", fmt.Sprintf("/v1/charges?order_id=%d", order), "", ""},
				{"POST", "/v1/charges", "k-during", chargeBody(orderSeq.Add(1), "tok_ok")},
			} {
				headers := map[string]string{}
				var body []byte
				if req.key != "" {
					headers["Idempotency-Key"] = req.key
					body = []byte(req.body)
				}
				start := time.Now()
				r, err := apitest.Do(t, nil, req.method, inst.URL+req.path, body, headers)
				if err != nil {
					t.Fatalf("%s %s: %v", req.method, req.path, err)
				}
				t.Logf("%s %s while the tables are locked: %d in %v", req.method, req.path, r.Status, time.Since(start).Round(time.Millisecond))
				wantProblem(t, r, 503, "unavailable")
				if r.Header.Get("Retry-After") == "" {
					t.Errorf("%s %s: 503 without Retry-After", req.method, req.path)
				}
			}
		})
	}
}
