package chaos

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"time"
)

// The nemesis injects one fault after another on a seeded random schedule,
// each healed after a random while: toxics and cuts on the network paths,
// SIGKILL and SIGSTOP of instances and workers, an immediate restart of
// PostgreSQL, an acquirer outage longer than its idempotency window, and in
// long runs a failover to the synchronous standby. It runs on the test's
// goroutine (pgtest's servers fail the test from there).

// fault is one injected fault, for the report and the visualisation.
type fault struct {
	Kind, Target string
	Start, End   int64 // since the history began
}

type pending struct {
	at    time.Time
	fault int
	heal  func() error
	proc  *proc // the process a kill's heal restarts
}

type nemesis struct {
	c        *cluster
	h        *history
	rng      *rand.Rand
	failover bool // may fail over once (long runs)
	failAt   time.Time
	weights  map[string]int // overrides faultWeights' weights

	faults  []fault
	pending []pending
	pgDown  bool
	errs    []string

	// The HA nemesis (ha_test.go): one fault on the Patroni cluster at a
	// time, the next once the cluster is healthy again.
	haKinds  []string // the faults to come, in order
	haRandom bool     // after haKinds, rounds of every kind in random orders (long runs)
	haCur    *haFault
	haNext   time.Time
}

var faultWeights = []struct {
	kind   string
	weight int
}{
	{"latency", 14}, {"timeout", 8}, {"reset_peer", 8}, {"slicer", 6}, {"limit_data", 6}, {"down", 10},
	{"kill", 16}, {"pause", 14}, {"pg-restart", 5}, {"acquirer-outage", 4},
}

func (n *nemesis) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(n.rng.Int64N(int64(hi-lo)+1))
}

// run injects faults until until, then heals everything.
func (n *nemesis) run(until time.Time) {
	for time.Now().Before(until) || n.haListed(until) {
		next := time.Now().Add(n.between(300*time.Millisecond, 1500*time.Millisecond))
		for time.Now().Before(next) {
			n.healDue(false)
			time.Sleep(50 * time.Millisecond)
		}
		n.supervise(false)
		if n.c.ha != nil {
			n.haStep()
		}
		if n.failover && !n.failAt.IsZero() && time.Now().After(n.failAt) && !n.pgDown {
			n.failAt = time.Time{}
			n.failOver()
			continue
		}
		n.inject()
	}
	n.healDue(true)
	n.supervise(false)
	if n.c.ha != nil {
		n.haFinish()
	}
	// Everything is healed: an instance that still could not start once
	// the database was back is an error now.
	for deadline := time.Now().Add(30 * time.Second); n.down() && time.Now().Before(deadline); time.Sleep(time.Second) {
		n.supervise(false)
	}
	n.supervise(true)
}

// down reports whether an instance is not running and no heal will start it.
func (n *nemesis) down() bool {
	for _, p := range n.c.instances() {
		if !p.alive() && !n.restarting(p) {
			return true
		}
	}
	return false
}

// noDatabaseAtStart reports whether err says an instance exited as it
// started because the database could not be reached (a failover in
// progress, the primary down): a supervisor starts it again later, as
// supervise does, so it is no fault of the instance's while faults last.
func noDatabaseAtStart(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "exited before listening") && strings.Contains(msg, "--db: connecting to PostgreSQL")
}

// supervise restarts every instance that exited by itself, as systemd or
// Kubernetes would: a worker exits when it cannot reach NATS or the
// database as it starts, which a restart during a fault can meet. An
// instance the nemesis killed is left to that kill's own heal. Unless
// final, an instance that exits again because the database is still out
// of reach is left for the next round.
func (n *nemesis) supervise(final bool) {
	for _, p := range n.c.instances() {
		if p.alive() || n.restarting(p) {
			continue
		}
		i := n.record("exited-restarted", p.name)
		if err := p.run(strings.HasPrefix(p.name, "serve")); err != nil && (final || !noDatabaseAtStart(err)) {
			n.errs = append(n.errs, fmt.Sprintf("restarting %s: %v", p.name, err))
		}
		n.faults[i].End = n.h.now()
	}
}

func (n *nemesis) restarting(p *proc) bool {
	for _, q := range n.pending {
		if q.proc == p {
			return true
		}
	}
	return false
}

func (n *nemesis) record(kind, target string) int {
	n.faults = append(n.faults, fault{Kind: kind, Target: target, Start: n.h.now()})
	return len(n.faults) - 1
}

func (n *nemesis) later(i int, d time.Duration, heal func() error) {
	n.pending = append(n.pending, pending{at: time.Now().Add(d), fault: i, heal: heal})
}

// healDue heals the faults whose time has come, or all with all.
func (n *nemesis) healDue(all bool) {
	sort.SliceStable(n.pending, func(i, j int) bool { return n.pending[i].at.Before(n.pending[j].at) })
	var keep []pending
	for _, p := range n.pending {
		if !all && time.Now().Before(p.at) {
			keep = append(keep, p)
			continue
		}
		if err := p.heal(); err != nil {
			n.errs = append(n.errs, fmt.Sprintf("healing %s of %s: %v", n.faults[p.fault].Kind, n.faults[p.fault].Target, err))
			if !all {
				p.at = time.Now().Add(time.Second) // try again
				keep = append(keep, p)
				continue
			}
		}
		n.faults[p.fault].End = n.h.now()
	}
	n.pending = keep
}

// impaired counts the instances killed or stopped now.
func (n *nemesis) impaired() int {
	k := 0
	for _, p := range n.c.instances() {
		p.mu.Lock()
		if p.stopped {
			k++
		}
		p.mu.Unlock()
		if !p.alive() {
			k++
		}
	}
	return k
}

func (n *nemesis) inject() {
	weight := func(kind string, w int) int {
		if v, ok := n.weights[kind]; ok {
			return v
		}
		return w
	}
	total := 0
	for _, f := range faultWeights {
		total += weight(f.kind, f.weight)
	}
	r, kind := n.rng.IntN(total), ""
	for _, f := range faultWeights {
		if r -= weight(f.kind, f.weight); r < 0 {
			kind = f.kind
			break
		}
	}
	links := n.c.links
	l := links[n.rng.IntN(len(links))]
	stream := []string{"upstream", "downstream"}[n.rng.IntN(2)]
	toxic := func(attrs string, lo, hi time.Duration) {
		if _, err := l.addToxic(kind, stream, 1, attrs); err != nil {
			n.errs = append(n.errs, err.Error())
			return
		}
		i := n.record(kind, l.name+" "+stream)
		n.later(i, n.between(lo, hi), l.heal)
	}
	switch kind {
	case "latency":
		toxic(fmt.Sprintf(`{"latency":%d,"jitter":%d}`, 50+n.rng.IntN(750), n.rng.IntN(200)), time.Second, 4*time.Second)
	case "timeout":
		toxic(fmt.Sprintf(`{"timeout":%d}`, n.rng.IntN(1500)), 500*time.Millisecond, 3*time.Second)
	case "reset_peer":
		toxic(fmt.Sprintf(`{"timeout":%d}`, n.rng.IntN(500)), 300*time.Millisecond, 2*time.Second)
	case "slicer":
		toxic(fmt.Sprintf(`{"average_size":%d,"size_variation":16,"delay":%d}`, 32+n.rng.IntN(224), 1000+n.rng.IntN(9000)), time.Second, 4*time.Second)
	case "limit_data":
		toxic(fmt.Sprintf(`{"bytes":%d}`, 100+n.rng.IntN(3900)), 500*time.Millisecond, 3*time.Second)
	case "down":
		l.cut()
		i := n.record(kind, l.name)
		n.later(i, n.between(500*time.Millisecond, 3*time.Second), l.heal)
	case "kill", "pause":
		if n.impaired() >= 2 {
			return
		}
		insts := n.c.instances()
		p := insts[n.rng.IntN(len(insts))]
		p.mu.Lock()
		stopped := p.stopped
		p.mu.Unlock()
		if stopped || !p.alive() {
			return
		}
		i := n.record(kind, p.name)
		if kind == "kill" {
			p.kill()
			n.later(i, n.between(300*time.Millisecond, 2*time.Second), func() error {
				err := p.run(strings.HasPrefix(p.name, "serve"))
				if err != nil && noDatabaseAtStart(err) {
					return nil // exited: supervise starts it again
				}
				return err
			})
			n.pending[len(n.pending)-1].proc = p
			return
		}
		p.pause()
		n.later(i, n.between(300*time.Millisecond, 3*time.Second), func() error { p.resume(); return nil })
	case "pg-restart":
		if n.pgDown || n.c.pg == nil {
			return
		}
		pg := n.c.pg
		i := n.record(kind, "postgres")
		pg.Crash()
		n.pgDown = true
		n.later(i, n.between(0, 1500*time.Millisecond), func() error {
			pg.Start()
			n.pgDown = false
			return nil
		})
	case "acquirer-outage":
		// Longer than the acquirer's idempotency window: a reference sent
		// before it and re-sent after it without a lookup moves money
		// twice.
		var cut []*link
		for _, l := range links {
			if l.kind == "acquirer" {
				l.cut()
				cut = append(cut, l)
			}
		}
		i := n.record(kind, "every instance->acquirer")
		n.later(i, n.between(6*time.Second, 8*time.Second), func() error {
			for _, l := range cut {
				if err := l.heal(); err != nil {
					return err
				}
			}
			return nil
		})
	}
}

// failOver crashes the primary and promotes the synchronous standby; the
// instances' URLs name both, with target_session_attrs=read-write.
func (n *nemesis) failOver() {
	if n.c.pair == nil {
		return
	}
	i := n.record("failover", "postgres primary -> standby")
	n.c.pair.Failover()
	n.c.pg = n.c.pair.Standby
	n.c.failedOver = true
	n.faults[i].End = n.h.now()
}

// counts returns the faults by kind, sorted by kind.
func (n *nemesis) counts() map[string]int {
	out := map[string]int{}
	for _, f := range n.faults {
		out[f.Kind]++
	}
	return out
}
