package e2e

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/chargeonce/chargeonce/internal/pgtest"
)

// buildRelease builds the last release recorded in docs/releases (N−1) from
// git history and returns its version and the path of its binary. A missing
// history or commit fails the test: a rolling-upgrade test that skips
// proves nothing.
func buildRelease(t *testing.T) (version, bin string) {
	t.Helper()
	root, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Fatalf("finding the repository root (the test needs git history): %v", err)
	}
	repo := strings.TrimSpace(string(root))
	b, err := os.ReadFile(filepath.Join(repo, "docs", "releases"))
	if err != nil {
		t.Fatal(err)
	}
	var commit string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 2 {
			version, commit = f[0], f[1]
		}
	}
	if commit == "" {
		t.Fatalf("docs/releases records no release")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if out, err := exec.Command("git", "-C", repo, "worktree", "add", "--detach", src, commit).CombinedOutput(); err != nil {
		t.Fatalf("checking out %s (%s) from git history: %v\n%s", version, commit, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("git", "-C", repo, "worktree", "remove", "--force", src).CombinedOutput(); err != nil {
			t.Errorf("removing the worktree of %s: %v\n%s", version, err, out)
		}
	})
	bin = filepath.Join(dir, "chargeonce-"+version)
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/chargeonce")
	cmd.Dir = src
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building %s (%s): %v\n%s", version, commit, err, out)
	}
	return version, bin
}

// dbNow reads the database's clock.
func dbNow(t *testing.T, url string) time.Time {
	t.Helper()
	var now time.Time
	db(t, url, func(conn *pgx.Conn) error { return conn.QueryRow(t.Context(), `SELECT clock_timestamp()`).Scan(&now) })
	return now
}

// TestRollingUpgrade runs the last release (N−1) and this tree (N) side by
// side on one database under load, as a rolling deploy does: N−1 serves a
// fresh schema (its own migrations), N's migrations apply under its
// traffic, N starts beside it, both take requests, then N−1 is stopped
// with SIGTERM. Some intents lose the acquirer's answer (tok_fail_after,
// tok_fail_before): their 202 is settled by recovery, on whichever release
// gets there first, across the deploy. Every intent is posted again and
// again, on either instance: no answer may be a 500, every intent must keep the one final
// answer it got first, the acquirer must hold one capture per approved
// intent, and every settled intent must have exactly one event, whichever
// release settled it.
func TestRollingUpgrade(t *testing.T) {
	t.Parallel()
	const (
		workers = 8
		perPool = 40 // intents per worker, 320 in all
		// newEvery spaces a worker's new intents, so that new intents
		// are created in every phase; replays fill the time between.
		newEvery = 150 * time.Millisecond
		pause    = 15 * time.Millisecond
		finalBy  = 20 * time.Second
	)
	began := time.Now()
	version, oldBin := buildRelease(t)
	binary(t)
	built := time.Since(began)

	url := pgtest.URL(t)
	ps := newProcs(t)
	acq := ps.startAcquirer("acquirer", "--slow", "300ms")
	old := ps.startBinary("serve-"+version, oldBin, serveArgs(url, acq.URL())...)

	var (
		mu    sync.Mutex
		bases = []string{old.URL()}
		names = map[string]string{old.URL(): version}
	)
	pick := func(i int) string {
		mu.Lock()
		defer mu.Unlock()
		return bases[i%len(bases)]
	}
	type tally struct {
		byStatus map[int]int
		errs     int
	}
	nameOf := func(base string) string {
		mu.Lock()
		defer mu.Unlock()
		return names[base]
	}
	tallies := map[string]*tally{}
	count := func(base string, a answer) {
		mu.Lock()
		defer mu.Unlock()
		n := names[base]
		if tallies[n] == nil {
			tallies[n] = &tally{byStatus: map[int]int{}}
		}
		if a.err != nil {
			tallies[n].errs++
		} else {
			tallies[n].byStatus[a.status]++
		}
	}

	type intent struct {
		key    string
		order  int64
		token  string
		body   []byte
		mu     sync.Mutex
		first  answer // the first final answer
		posts  int
		got202 bool // settled by recovery: an attempt answered 202
	}
	var (
		all       []*intent
		allMu     sync.Mutex
		stop      atomic.Bool
		changed   atomic.Int64 // final answers that differ from the first
		errs500   atomic.Int64
		unsettled atomic.Int64
	)
	// post drives one intent to a final answer as the Go client does:
	// 202, 409, 503 and a broken connection are retried (on the next
	// instance); a 500 is counted, and retried too.
	post := func(c *http.Client, in *intent, turn *int) {
		deadline := time.Now().Add(finalBy)
		for {
			base := pick(*turn)
			*turn++
			a := charge(c, base, in.key, in.body)
			count(base, a)
			in.mu.Lock()
			in.posts++
			in.got202 = in.got202 || (a.err == nil && a.status == 202)
			in.mu.Unlock()
			switch {
			case a.final():
				in.mu.Lock()
				defer in.mu.Unlock()
				if in.first.status == 0 {
					in.first = a
				} else if a.status != in.first.status || !bytes.Equal(a.body, in.first.body) {
					changed.Add(1)
					t.Errorf("%s (%s) on %s: final %s; first final %s", in.key, in.token, nameOf(base), a, in.first)
				}
				return
			case a.err == nil && a.status == 500:
				errs500.Add(1)
				t.Errorf("%s (%s) on %s: %s", in.key, in.token, nameOf(base), a)
			case a.err == nil && a.status != 202 && a.status != 409 && a.status != 503:
				t.Errorf("%s (%s) on %s: unexpected answer %s", in.key, in.token, nameOf(base), a)
				return
			}
			if time.Now().After(deadline) {
				unsettled.Add(1)
				t.Errorf("%s (%s): no final answer within %s (last %s)", in.key, in.token, finalBy, a)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	transport := &http.Transport{MaxIdleConnsPerHost: 32}
	defer transport.CloseIdleConnections()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			c := &http.Client{Transport: transport, Timeout: 10 * time.Second}
			rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(w)))
			var mine []*intent
			turn := w
			next := time.Now()
			for !stop.Load() || len(mine) < perPool {
				var in *intent
				if len(mine) < perPool && !time.Now().Before(next) {
					order := newOrder()
					token := "tok_ok"
					switch rng.IntN(8) {
					case 0:
						token = "tok_declined"
					case 1:
						token = "tok_slow"
					case 2:
						// The answer is lost after the capture: 202,
						// and recovery (of either release) settles it.
						token = "tok_fail_after"
					case 3:
						token = "tok_fail_before"
					}
					in = &intent{key: uniqueName("upgrade-"), order: order, token: token, body: chargeBody(order, token)}
					mine = append(mine, in)
					next = time.Now().Add(newEvery)
				} else if len(mine) > 0 {
					in = mine[rng.IntN(len(mine))]
				} else {
					time.Sleep(pause)
					continue
				}
				if in.posts == 0 {
					// A new intent is posted by two clients at once,
					// on both instances when both are up: one of them
					// reads the other's processing record (409).
					var pair sync.WaitGroup
					other := turn + 1
					pair.Go(func() { post(c, in, &other) })
					post(c, in, &turn)
					pair.Wait()
				} else {
					post(c, in, &turn)
				}
				time.Sleep(pause)
			}
			allMu.Lock()
			all = append(all, mine...)
			allMu.Unlock()
		})
	}

	// The deploy, under the load.
	start := time.Now()
	var at []string
	mark := func(what string) {
		at = append(at, fmt.Sprintf("%s at %v", what, time.Since(start).Round(time.Millisecond)))
	}
	time.Sleep(1500 * time.Millisecond)
	// The database's clock, at which charges settled before the deploy
	// (by N−1 alone) are told apart from those settled during it.
	migrateAt := dbNow(t, url)
	mark("migrate started")
	mig := ps.start("migrate", "migrate", "--db", url)
	if !mig.wait(60 * time.Second) {
		t.Fatalf("migrate did not finish within 60s")
	}
	if err := mig.exitErr(); err != nil {
		t.Fatalf("migrate: %v\n%s", err, mig.logText())
	}
	mark("migrate done")
	// An N−1 instance (re)started during the deploy finds N's schema.
	old2 := ps.startBinary("serve-"+version+"-2", oldBin, serveArgs(url, acq.URL())...)
	cur := ps.start("serve-new", serveArgs(url, acq.URL())...)
	mu.Lock()
	bases = append(bases, cur.URL(), old2.URL())
	names[old2.URL()] = version
	names[cur.URL()] = "new"
	mu.Unlock()
	mark("new and a second " + version + " serving")
	time.Sleep(2500 * time.Millisecond)
	old.signal(syscall.SIGTERM)
	old2.signal(syscall.SIGTERM)
	mark("SIGTERM to both " + version)
	for _, p := range []*proc{old, old2} {
		if !p.wait(30 * time.Second) {
			t.Fatalf("%s did not exit within 30s of SIGTERM", p.name)
		}
		if err := p.exitErr(); err != nil {
			t.Errorf("%s after SIGTERM: %v", p.name, err)
		}
	}
	mu.Lock()
	bases = []string{cur.URL()}
	mu.Unlock()
	mark(version + " exited")
	oldGoneAt := dbNow(t, url)
	time.Sleep(1500 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	mark("load done")

	// Every intent settled once: one more replay on N gives the first
	// final answer again.
	c := &http.Client{Transport: transport, Timeout: 10 * time.Second}
	approved, declined, posts, recovered := 0, 0, 0, 0
	for _, in := range all {
		if in.got202 {
			recovered++
		}
		if in.first.status == 0 {
			continue
		}
		a := charge(c, cur.URL(), in.key, in.body)
		if a.err != nil || a.status != in.first.status || !bytes.Equal(a.body, in.first.body) {
			changed.Add(1)
			t.Errorf("%s: last replay %s; first final %s", in.key, a, in.first)
		}
		posts += in.posts
		switch in.first.status {
		case 201:
			approved++
		case 402:
			declined++
		}
		if want := map[string]int{"tok_ok": 201, "tok_slow": 201, "tok_fail_after": 201, "tok_fail_before": 201, "tok_declined": 402}[in.token]; in.first.status != want {
			t.Errorf("%s (%s): final %s; want %d", in.key, in.token, in.first, want)
		}
	}

	ac := acquirerClient(acq)
	doubles := 0
	for _, in := range all {
		captured, list := capturesOf(t, ac, in.order)
		if captured > 1 {
			doubles++
			t.Errorf("order %d captured %d times: %+v", in.order, captured, list)
		}
	}
	st, err := ac.Stats(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var storedCaptured, storedCharges, migrations int64
	db(t, url, func(conn *pgx.Conn) error {
		return conn.QueryRow(t.Context(), `
SELECT (SELECT count(*) FROM charges WHERE status = 'captured'),
       (SELECT count(*) FROM charges),
       (SELECT count(*) FROM schema_migrations)`).Scan(&storedCaptured, &storedCharges, &migrations)
	})

	// Every settled intent has exactly one event, whichever release
	// settled it, counted by when its charge settled: before N's
	// migrations (by N−1 alone; 0011 records their events), while both
	// releases served (N−1's statements write none; the trigger on charges
	// does), and after.
	var evs struct{ settled, events, missing, wrong, before, during, after int64 }
	db(t, url, func(conn *pgx.Conn) error {
		return conn.QueryRow(t.Context(), `
SELECT count(*) FILTER (WHERE c.status <> 'processing'),
       (SELECT count(*) FROM webhook_events),
       count(*) FILTER (WHERE c.status <> 'processing' AND e.id IS NULL),
       count(e.id) FILTER (WHERE c.status = 'processing' OR e.type <> 'charge.' || c.status
           OR e.id <> 'evt_' || substr(c.id, 4) OR e.merchant_id <> c.merchant_id),
       count(e.id) FILTER (WHERE c.updated_at < $1),
       count(e.id) FILTER (WHERE c.updated_at >= $1 AND c.updated_at < $2),
       count(e.id) FILTER (WHERE c.updated_at >= $2)
FROM charges c LEFT JOIN webhook_events e ON e.charge_id = c.id`, migrateAt, oldGoneAt).
			Scan(&evs.settled, &evs.events, &evs.missing, &evs.wrong, &evs.before, &evs.during, &evs.after)
	})

	t.Logf("upgrade %s -> this tree: builds %v; %s", version, built.Round(time.Millisecond), strings.Join(at, ", "))
	t.Logf("upgrade: %d intents (%d approved, %d declined, %d of them answered 202 and settled by recovery), %d posts; %d migrations recorded", len(all), approved, declined, recovered, posts, migrations)
	mu.Lock()
	var ns []string
	for n := range tallies {
		ns = append(ns, n)
	}
	sort.Strings(ns)
	for _, n := range ns {
		var parts []string
		var codes []int
		for s := range tallies[n].byStatus {
			codes = append(codes, s)
		}
		sort.Ints(codes)
		for _, s := range codes {
			parts = append(parts, fmt.Sprintf("%d×%d", tallies[n].byStatus[s], s))
		}
		t.Logf("upgrade: answers of %s: %s, %d broken connections", n, strings.Join(parts, " "), tallies[n].errs)
	}
	mu.Unlock()
	t.Logf("upgrade: acquirer %d captures (%d requests, %d duplicate requests); database %d charges, %d captured; 500s=%d doubles=%d unsettled=%d changed_answers=%d",
		st.Captures, st.CaptureRequests, st.DuplicateRequests, storedCharges, storedCaptured, errs500.Load(), doubles, unsettled.Load(), changed.Load())

	t.Logf("upgrade: events: %d for %d settled charges (%d settled intents): %d for charges settled before the migrations, %d while %s served, %d after; %d settled charges without an event, %d events that do not match their charge",
		evs.events, evs.settled, approved+declined, evs.before, evs.during, version, evs.after, evs.missing, evs.wrong)
	if evs.settled != int64(approved+declined) || evs.events != evs.settled || evs.missing != 0 || evs.wrong != 0 {
		t.Errorf("%d events for %d settled charges and %d settled intents (%d settled charges without an event, %d events that do not match their charge): want one per settled intent",
			evs.events, evs.settled, approved+declined, evs.missing, evs.wrong)
	}
	if recovered == 0 {
		t.Errorf("no intent went through recovery: the lost answers did not happen")
	}
	if len(all) != workers*perPool {
		t.Errorf("%d intents; want %d", len(all), workers*perPool)
	}
	if st.Captures != int64(approved) || storedCaptured != int64(approved) {
		t.Errorf("acquirer captures %d, stored captured charges %d, approved intents %d: want all equal", st.Captures, storedCaptured, approved)
	}
	if storedCharges != int64(len(all)) {
		t.Errorf("%d charges stored for %d intents", storedCharges, len(all))
	}
	if time.Since(began) > 90*time.Second {
		t.Errorf("the upgrade test took %v; its budget is 90s", time.Since(began))
	}
}
