package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/internal/natstest"
	"github.com/chargeonce/chargeonce/queue"
)

// ciSeeds are the seeds `go test ./chaos/` runs, each for ciTime: fixed,
// so that CI runs the same schedules every time.
var ciSeeds = []uint64{1, 2}

const (
	ciTime = 15 * time.Second
	// DefaultTime is how long `make chaos` runs without CHAOS_TIME.
	defaultTime = 5 * time.Minute
	// failoverAfter is the shortest run that fails PostgreSQL over once.
	failoverAfter = time.Minute
	clients       = 8
)

// TestChaos runs the nemesis suite: with CHAOS_TIME (or CHAOS_SEED) set,
// one run that long with that seed (a random one, printed, without
// CHAOS_SEED); otherwise the CI version, a short run for each seed of a
// fixed list. Any anomaly fails it, naming the intent.
func TestChaos(t *testing.T) {
	t.Parallel()
	long, seed := os.Getenv("CHAOS_TIME"), os.Getenv("CHAOS_SEED")
	if long == "" && seed == "" {
		for _, s := range ciSeeds {
			t.Run("seed="+strconv.FormatUint(s, 10), func(t *testing.T) {
				wantClean(t, runChaos(t, config{seed: s, duration: ciTime}))
			})
		}
		return
	}
	d := defaultTime
	if long != "" {
		var err error
		if d, err = time.ParseDuration(long); err != nil || d <= 0 {
			t.Fatalf("CHAOS_TIME=%q: want a positive duration such as 30m", long)
		}
	}
	s := rand.Uint64() % 1_000_000 //nolint:gosec // G404: a seed to print and replay
	if seed != "" {
		var err error
		if s, err = strconv.ParseUint(seed, 10, 64); err != nil {
			t.Fatalf("CHAOS_SEED=%q: want an unsigned integer", seed)
		}
	}
	t.Logf("chaos: seed %d, %s (replay with CHAOS_SEED=%d CHAOS_TIME=%s make chaos)", s, d, s, d)
	wantClean(t, runChaos(t, config{seed: s, duration: d, pair: d >= failoverAfter}))
}

func wantClean(t *testing.T, r *report) {
	t.Helper()
	if len(r.anomalies) > 0 {
		var b strings.Builder
		for _, a := range r.anomalies {
			b.WriteString("\n  " + a.String())
		}
		t.Errorf("%d anomalies (seed %d; history and visualisations in %s):%s", len(r.anomalies), r.seed, r.dir, b.String())
	}
	if len(r.refundAnomalies) > 0 {
		t.Errorf("%d refund anomalies (seed %d; history in %s):\n  %s", len(r.refundAnomalies), r.seed, r.dir, strings.Join(r.refundAnomalies, "\n  "))
	}
}

// config is one run.
type config struct {
	seed     uint64
	duration time.Duration
	tags     string         // build tags of the binary under test
	pair     bool           // a primary with a synchronous standby, failed over once
	ha       bool           // Patroni on etcd, under the HA nemesis (ha_test.go)
	haKinds  []string       // with ha: the HA faults to inject in this order; rounds of every kind in random orders when empty
	weights  map[string]int // the nemesis's fault weights that differ from faultWeights
}

// report is what a run found.
type report struct {
	seed      uint64
	dir       string // where the history, the seed and visualisations went
	intents   int
	ops       map[string]int // by via/outcome
	faults    map[string]int
	anomalies []anomaly
	// refunds counts the refund calls by outcome; refundAnomalies are
	// what checkRefunds found.
	refunds         map[string]int
	refundAnomalies []string
	// resolutions counts the operator's resolutions of stuck refunds as
	// failed, by answer (operator_test.go).
	resolutions map[string]int
	// With ha: the HA faults, and the write-unavailability each caused
	// (ha_test.go); when each HTTP 500 was answered.
	ha   []haWindow
	five []time.Time
}

// runChaos runs the system under the nemesis for cfg.duration, heals it,
// learns every intent's final answer, reads the acquirer's ledger and
// checks the history.
func runChaos(t *testing.T, cfg config) *report {
	t.Helper()
	bin := binary(t, cfg.tags)
	c := newCluster(t, bin, cfg.pair, cfg.ha)
	h := newHistory()

	js := natstest.JetStream(t, c.nats.URL)
	if err := queue.EnsureStreams(t.Context(), js, queue.StreamOptions{}); err != nil {
		t.Fatal(err)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 32
	w := &workload{c: c, h: h, seed: cfg.seed, baseOrd: time.Now().UnixNano() % 1e9 * 1000, byKey: map[string]int{},
		hc: &http.Client{Transport: tr}, nc: js.Conn(), js: js}
	defer tr.CloseIdleConnections()
	if err := w.startResults(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer w.results.stop()

	// The clients run until the nemesis is done: cfg.duration, or on the HA
	// cluster until the last of its listed faults is over.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() { w.client(ctx, i) })
	}
	op := &operator{}
	wg.Go(func() { op.run(ctx, w.hc, c.adminURL) })
	nem := &nemesis{c: c, h: h, rng: rand.New(rand.NewPCG(cfg.seed, 0xc4a05)), failover: cfg.pair, weights: cfg.weights} //nolint:gosec // G404: a seeded schedule
	if cfg.pair {
		nem.failAt = time.Now().Add(cfg.duration * 2 / 5)
	}
	if cfg.ha {
		nem.haKinds, nem.haRandom = cfg.haKinds, len(cfg.haKinds) == 0
	}
	nem.run(time.Now().Add(cfg.duration))
	cancel()
	wg.Wait() // every client finishes the intent it was running
	end := h.now()

	// Healed: every intent whose calls got no final answer is settled by
	// recovery; one more call learns its answer.
	// Records that failed many times rest for recovery's back-off (up to
	// minutes) first; one still processing after the wait is checked as an
	// intent whose answer is unknown (at most one capture).
	settle := min(max(cfg.duration/10, 10*time.Second), 3*time.Minute)
	if n, err := c.waitSettled(settle); n > 0 || err != nil {
		t.Logf("%s after healing, %d records still processing (%v)", settle, n, err)
	}
	var final sync.WaitGroup
	sem := make(chan struct{}, 8)
	answered := map[int]bool{}
	for _, r := range h.records() {
		if r.Out.Kind == outFinal || r.Out.Kind == outReused {
			answered[r.Intent] = true
		}
	}
	for _, in := range w.all() {
		// On the HA cluster every answered intent is asked once more, after
		// the failovers: an acknowledged charge the new primary lacks would
		// answer differently, or capture again.
		if answered[in.ID] && !cfg.ha {
			continue
		}
		sem <- struct{}{}
		final.Go(func() {
			defer func() { <-sem }()
			w.httpCall(4000, in, 1)
		})
	}
	final.Wait()
	w.settleRefunds()

	// The acquirer's ledger, read after everything else.
	acq := acquirer.NewClient("http://"+c.acq.Addr(), &http.Client{Timeout: 10 * time.Second})
	for _, in := range w.all() {
		call := h.now()
		list, err := acq.ListByOrder(t.Context(), in.Order, merchant)
		if err != nil {
			t.Fatalf("reading the acquirer's ledger for order %d: %v", in.Order, err)
		}
		o := output{Kind: opLedger}
		for _, cp := range list {
			switch cp.Status {
			case "captured":
				o.Captured++
			case "declined":
				o.Declined++
			}
		}
		h.add(record{Intent: in.ID, Client: 5000, In: input{Kind: opLedger, Via: "acquirer"}, Out: o, Call: call, Ret: h.now()})
	}

	refundEntries, err := refundLedger(t.Context(), acq, h.start)
	if err != nil {
		t.Fatalf("reading the acquirer's ledger of refunds: %v", err)
	}

	r := &report{seed: cfg.seed, intents: len(w.all()), ops: map[string]int{}, faults: nem.counts(), refunds: map[string]int{}, resolutions: op.counts()}
	works, refundRecs := w.refunds.snapshot()
	for _, rec := range refundRecs {
		r.refunds[rec.Out.Kind]++
	}
	r.refundAnomalies = checkRefunds(works, refundRecs, refundEntries)
	recs := h.records()
	for _, rec := range recs {
		if rec.In.Kind == opCharge {
			r.ops[rec.In.Via+"/"+rec.Out.Kind]++
		}
	}
	r.dir = outputDir(t, cfg.seed)
	if c.ha != nil {
		r.ha = haWindows(h, c.ha.probe, nem.faults)
		r.five = w.fiveHundreds()
	}
	r.anomalies = check(w.all(), recs, nem.faults, r.dir)
	writeHistory(t, r, w.all(), recs, nem.faults, refundRecs)
	for _, e := range nem.errs {
		t.Logf("nemesis: %s", e)
	}

	total := 0
	var parts []string
	for k, v := range r.ops {
		total += v
		parts = append(parts, fmt.Sprintf("%s %d", k, v))
	}
	sort.Strings(parts)
	var fs []string
	nf := 0
	for k, v := range r.faults {
		nf += v
		fs = append(fs, fmt.Sprintf("%s %d", k, v))
	}
	sort.Strings(fs)
	var rp []string
	for k, v := range r.refunds {
		rp = append(rp, fmt.Sprintf("%s %d", k, v))
	}
	sort.Strings(rp)
	var rs []string
	for k, v := range r.resolutions {
		rs = append(rs, fmt.Sprintf("%s %d", k, v))
	}
	sort.Strings(rs)
	t.Logf("chaos seed %d: %s of load, %d intents, %d charge operations (%s); %d refunds of %d charges (%s), %d in the ledger, operator's resolutions as failed (%s); %d faults (%s); %d anomalies, %d refund anomalies; history in %s",
		cfg.seed, time.Duration(end).Round(time.Second), r.intents, total, strings.Join(parts, ", "),
		len(refundRecs), len(works), strings.Join(rp, ", "), len(refundEntries), strings.Join(rs, ", "),
		nf, strings.Join(fs, ", "), len(r.anomalies), len(r.refundAnomalies), r.dir)
	if nf == 0 || total == 0 {
		t.Errorf("a run with %d faults and %d operations proves nothing", nf, total)
	}
	reconcileAfterChaos(t, c, cfg)
	return r
}

// outputDir is where a run writes its history, seed and visualisations:
// CHAOS_OUT when set (make chaos sets it), else a directory that outlives
// the test, so a failed run can be looked at and replayed.
func outputDir(t *testing.T, seed uint64) string {
	t.Helper()
	base := os.Getenv("CHAOS_OUT")
	if base != "" {
		if err := os.MkdirAll(base, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	dir, err := os.MkdirTemp(base, fmt.Sprintf("chaos-seed%d-", seed))
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// writeHistory writes the seed, the summary and the whole history into the
// run's directory; the directory is removed again when the run was clean
// and CHAOS_OUT is unset.
func writeHistory(t *testing.T, r *report, intents []*intent, recs []record, faults []fault, refunds []refundRecord) {
	t.Helper()
	write := func(name string, v any) {
		b, err := json.MarshalIndent(v, "", " ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(r.dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("seed.json", map[string]any{"seed": r.seed, "replay": fmt.Sprintf("CHAOS_SEED=%d make chaos", r.seed),
		"intents": r.intents, "operations": r.ops, "faults": r.faults, "anomalies": len(r.anomalies),
		"refunds": r.refunds, "refund_anomalies": r.refundAnomalies})
	write("intents.json", intents)
	write("history.json", recs)
	write("faults.json", faults)
	write("refunds.json", refunds)
	t.Cleanup(func() {
		if !t.Failed() && len(r.anomalies) == 0 && len(r.refundAnomalies) == 0 && os.Getenv("CHAOS_OUT") == "" {
			os.RemoveAll(r.dir)
		}
	})
}
