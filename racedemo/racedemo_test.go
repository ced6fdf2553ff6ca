package racedemo_test

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/chargeonce/chargeonce/internal/pgtest"
	"github.com/chargeonce/chargeonce/postgres"
	"github.com/chargeonce/chargeonce/racedemo"
)

// latency is the simulated acquirer's delay in these tests: long enough
// next to a database round trip (even under -race on a busy machine) that
// waiting for it cannot be mistaken for anything else.
const latency = 400 * time.Millisecond

// setup returns a small workload on a PostgreSQL schema of the test's own:
// every attempt of an intent starts at once, on different instances.
func setup(t *testing.T, s racedemo.Strategy) racedemo.Options {
	t.Helper()
	return racedemo.Options{
		DB:        pgtest.URL(t),
		Strategy:  s,
		Intents:   2,
		Attempts:  2,
		Instances: 2,
		Latency:   latency,
		PoolSize:  2,
	}
}

func run(t *testing.T, o racedemo.Options) *racedemo.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r, err := racedemo.Run(ctx, o)
	if err != nil {
		t.Fatalf("running %s: %v", o.Label(), err)
	}
	if n := r.Errors(); n > 0 {
		t.Fatalf("%s: %d attempts failed; the first: %v", o.Label(), n, r.FirstError())
	}
	return r
}

// countRows counts the rows of an order in one of the demonstration's
// tables, straight from the database.
func countRows(t *testing.T, url, table, merchant string, orderID int64) int {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connecting: %v", err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE merchant_id = $1 AND order_id = $2", merchant, orderID).Scan(&n); err != nil {
		t.Fatalf("counting %s: %v", table, err)
	}
	return n
}

// With every check forced before any insert, check-then-act charges every
// intent twice: two rows in its table, two captures at the acquirer.
func TestCheckThenActWithForcedInterleavingChargesTwice(t *testing.T) {
	t.Parallel()
	o := setup(t, racedemo.CheckThenAct)
	o.Barrier = true
	r := run(t, o)

	for i := 0; i < r.Intents; i++ {
		as := r.IntentAttempts(i)
		for _, a := range as {
			for _, b := range as {
				if b.Insert.From < a.Check.To {
					t.Fatalf("intent %d: attempt %d inserted at %s, before attempt %d finished its check at %s; the barrier did not hold",
						i+1, b.Index+1, b.Insert.From, a.Index+1, a.Check.To)
				}
			}
			if !a.Captured || a.Answer != "201 captured" {
				t.Errorf("intent %d attempt %d: answer %q, captured %v; want every attempt to charge", i+1, a.Index+1, a.Answer, a.Captured)
			}
		}
		if got := r.CapturesPerIntent[i]; got != 2 {
			t.Errorf("intent %d: %d captures at the acquirer, want 2", i+1, got)
		}
		if got := countRows(t, o.DB, "race_naive_charges", r.Merchant, int64(i+1)); got != 2 {
			t.Errorf("intent %d: %d rows in race_naive_charges, want 2", i+1, got)
		}
	}
	if r.DoubleCharges() != r.Intents || r.Captures != 4 {
		t.Errorf("double charges %d, captures %d; want %d and 4", r.DoubleCharges(), r.Captures, r.Intents)
	}
}

// chargeonce's own engine, under the same all-at-once arrival, charges
// every intent once and records one charge.
func TestInsertFirstChargesOnce(t *testing.T) {
	t.Parallel()
	o := setup(t, racedemo.InsertFirst)
	o.Attempts = 3
	r := run(t, o)

	store, err := postgres.Open(context.Background(), o.DB)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	for i := 0; i < r.Intents; i++ {
		if got := r.CapturesPerIntent[i]; got != 1 {
			t.Errorf("intent %d: %d captures at the acquirer, want 1", i+1, got)
		}
		charges, err := store.ChargesListByOrder(context.Background(), r.Merchant, int64(i+1))
		if err != nil {
			t.Fatal(err)
		}
		if len(charges) != 1 {
			t.Errorf("intent %d: %d charges recorded, want 1", i+1, len(charges))
		}
		first := r.First(i)
		for j, a := range r.IntentAttempts(i) {
			if j != first && a.Answer != "409 in progress" && a.Answer != "201 replayed" {
				t.Errorf("intent %d attempt %d answered %q, want 409 in progress (or a replay)", i+1, j+1, a.Answer)
			}
		}
	}
	if r.DoubleCharges() != 0 || r.Captures != int64(r.Intents) {
		t.Errorf("double charges %d, captures %d; want 0 and %d", r.DoubleCharges(), r.Captures, r.Intents)
	}
}

// The locked transaction charges once too, but its retry waits on the row
// lock for the whole acquirer call; insert-first's retry does not wait for
// the acquirer at all.
func TestLockedTransactionRetryWaitsForTheAcquirer(t *testing.T) {
	t.Parallel()
	locked := run(t, setup(t, racedemo.LockedTransaction))
	first := run(t, setup(t, racedemo.InsertFirst))

	if locked.DoubleCharges() != 0 || locked.Captures != int64(locked.Intents) {
		t.Errorf("locked-transaction: double charges %d, captures %d; want 0 and %d", locked.DoubleCharges(), locked.Captures, locked.Intents)
	}
	lw, fw := locked.RetryWaits(), first.RetryWaits()
	t.Logf("retry waits with acquirer latency %s: locked-transaction %v, insert-first %v", latency, lw, fw)
	if len(lw) != locked.Intents || len(fw) != first.Intents {
		t.Fatalf("got %d and %d retry waits, want one per intent", len(lw), len(fw))
	}
	if lw[0] < latency {
		t.Errorf("locked-transaction: a retry answered after %s, less than the acquirer's latency %s", lw[0], latency)
	}
	for i := 0; i < locked.Intents; i++ {
		f := locked.IntentAttempts(i)[locked.First(i)]
		for _, a := range locked.IntentAttempts(i) {
			if a.Index != f.Index && a.Done < f.Acquirer.To {
				t.Errorf("locked-transaction intent %d: the retry answered at %s, before the first's acquirer call ended at %s", i+1, a.Done, f.Acquirer.To)
			}
		}
	}
	if slowest := fw[len(fw)-1]; slowest >= latency/2 {
		t.Errorf("insert-first: a retry waited %s for its answer; want far less than the acquirer's latency %s", slowest, latency)
	}
}

// The timeline is well-formed XML with one lane per attempt of the intent
// it draws, each lane carrying its phases and its answer.
func TestWriteSVGOneLanePerAttempt(t *testing.T) {
	t.Parallel()
	o := setup(t, racedemo.CheckThenAct)
	o.Barrier, o.Attempts, o.Latency = true, 3, 50*time.Millisecond
	r := run(t, o)

	var buf bytes.Buffer
	if err := racedemo.WriteSVG(&buf, []*racedemo.Result{r}); err != nil {
		t.Fatal(err)
	}
	lanes := svgLanes(t, buf.Bytes())
	if len(lanes) != o.Attempts {
		t.Fatalf("%d lanes, want one per attempt (%d)", len(lanes), o.Attempts)
	}
	for i, l := range lanes {
		if l.phases < 3 || !strings.Contains(l.text, "201 captured") {
			t.Errorf("lane %d: %d phase bars, text %q; want check, insert and acquirer bars and the answer", i+1, l.phases, l.text)
		}
	}
}

type lane struct {
	phases int
	text   string
}

// svgLanes parses an SVG strictly and returns its lanes.
func svgLanes(t *testing.T, b []byte) []lane {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(b))
	var lanes []lane
	depth, laneDepth := 0, -1
	root := ""
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("the SVG is not well-formed XML: %v", err)
		}
		switch el := tok.(type) {
		case xml.StartElement:
			depth++
			if root == "" {
				root = el.Name.Local
			}
			class := ""
			for _, a := range el.Attr {
				if a.Name.Local == "class" {
					class = a.Value
				}
			}
			switch {
			case class == "lane":
				lanes = append(lanes, lane{})
				laneDepth = depth
			case class == "phase" && laneDepth > 0:
				lanes[len(lanes)-1].phases++
			}
		case xml.EndElement:
			if depth == laneDepth {
				laneDepth = -1
			}
			depth--
		case xml.CharData:
			if laneDepth > 0 {
				lanes[len(lanes)-1].text += string(el)
			}
		}
	}
	if root != "svg" {
		t.Fatalf("root element %q, want svg", root)
	}
	return lanes
}

// On SQLite the naive design still races (its check and insert are
// separate statements), and the locked transaction, holding the database's
// only write lock across the acquirer call, still makes the retry wait.
func TestSQLiteStrategies(t *testing.T) {
	t.Parallel()
	db := "sqlite:" + filepath.Join(t.TempDir(), "race.db")
	base := racedemo.Options{DB: db, Intents: 2, Attempts: 2, Instances: 2, Latency: 100 * time.Millisecond, PoolSize: 2}

	o := base
	o.Strategy, o.Barrier = racedemo.CheckThenAct, true
	if r := run(t, o); r.DoubleCharges() != r.Intents {
		t.Errorf("check-then-act on SQLite: %d double charges, want %d", r.DoubleCharges(), r.Intents)
	}
	o = base
	o.Strategy = racedemo.LockedTransaction
	r := run(t, o)
	if r.DoubleCharges() != 0 {
		t.Errorf("locked-transaction on SQLite: %d double charges, want 0", r.DoubleCharges())
	}
	if w := r.RetryWaits(); w[0] < o.Latency {
		t.Errorf("locked-transaction on SQLite: a retry answered after %s, less than the latency %s", w[0], o.Latency)
	}
	o = base
	o.Strategy = racedemo.InsertFirst
	if r := run(t, o); r.DoubleCharges() != 0 || r.Captures != int64(r.Intents) {
		t.Errorf("insert-first on SQLite: double charges %d, captures %d; want 0 and %d", r.DoubleCharges(), r.Captures, r.Intents)
	}
}
