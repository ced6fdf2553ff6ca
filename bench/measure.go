package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// rssRow is the servers' peak RSS over one concurrency's workloads.
type rssRow struct {
	clients int
	// sincePrev is true when the peak was reset before this concurrency
	// (else it is the peak since the server started).
	sincePrev bool
	peak      map[string]int64 // way → bytes
}

// preloadResult compares new on an empty table with new on a table that
// already holds keys.
type preloadResult struct {
	keys        int
	took        time.Duration
	empty, full *result
}

// measure runs every workload at every concurrency, and records the
// servers' peak RSS per concurrency.
func (b *bench) measure(ctx context.Context) error {
	rc := b.ratioClients()
	for _, c := range b.cfg.Concurrency {
		row := rssRow{clients: c, sincePrev: true, peak: map[string]int64{}}
		for _, w := range b.ways {
			if w.server != nil && resetPeak(w.server.pid()) != nil {
				row.sincePrev = false
			}
		}
		for _, wl := range b.cfg.Workloads {
			if wl == WorkloadContended && c < 2 {
				continue // a group of one is the new workload
			}
			rs, err := b.measureCell(ctx, wl, c, b.cfg.Warmup)
			if err != nil {
				return err
			}
			b.results = append(b.results, rs...)
			for _, r := range rs {
				b.logf("%-9s %3d clients  %-10s %8.0f req/s  p50 %8s  p99 %8s  errors %d",
					wl, c, r.way, r.rps(), fmtDur(r.percentile(50)), fmtDur(r.percentile(99)), r.errors)
				if r.errors > 0 {
					b.logf("  first error of %s: %s", r.way, r.firstErr)
				}
			}
			if b.cfg.ProfileDir != "" && c == rc && wl != WorkloadContended {
				if err := b.profile(ctx, wl, c); err != nil {
					return fmt.Errorf("--profile: %w", err)
				}
			}
		}
		for _, w := range b.ways {
			if w.server == nil {
				continue
			}
			if peak, _, err := memory(w.server.pid()); err == nil {
				row.peak[w.name] = peak
			}
		}
		b.rss = append(b.rss, row)
	}
	return nil
}

// profile takes a CPU profile of each server under workload at c clients,
// in an extra run that is not measured.
func (b *bench) profile(ctx context.Context, workload string, c int) error {
	if err := os.MkdirAll(b.cfg.ProfileDir, 0o755); err != nil {
		return err
	}
	d := max(time.Second, b.cfg.Duration.Round(time.Second))
	for _, w := range b.ways {
		if w.server == nil {
			continue
		}
		clients := make([]client, c)
		for i := range clients {
			clients[i] = w.newClient()
		}
		path := filepath.Join(b.cfg.ProfileDir, w.name+"-"+workload+".pprof")
		err := w.server.profile(ctx, d, path, func() error {
			return b.slice(ctx, workload, w, clients, nil, d+250*time.Millisecond, nil)
		})
		for _, cl := range clients {
			cl.close()
		}
		if err != nil {
			return fmt.Errorf("profiling %s under %s: %w", w.name, workload, err)
		}
		b.logf("wrote %s", path)
	}
	return nil
}

// measurePreloaded measures chargeonce's new workload at the ratio
// concurrency on two fresh databases, one empty and one holding Preload
// keys, interleaved like every other measurement.
func (b *bench) measurePreloaded(ctx context.Context) error {
	start := time.Now()
	emptyDB, err := b.newDatabase(ctx, "_empty")
	if err != nil {
		return err
	}
	fullDB, err := b.newDatabase(ctx, "_preloaded")
	if err != nil {
		return err
	}
	// Both are migrated, and one is loaded, before their servers start.
	for _, db := range []string{emptyDB, fullDB} {
		s, err := openStore(ctx, db)
		if err != nil {
			return fmt.Errorf("--db: %w", err)
		}
		if db == fullDB {
			err = preload(ctx, s, b.cfg.Preload)
		} else {
			err = analyze(ctx, s)
		}
		s.Close()
		if err != nil {
			return err
		}
	}
	if b.postgres {
		// The load wrote hundreds of megabytes of WAL, and the checkpoint
		// it set off would otherwise fall into the measurement. After this
		// one both tables start even: the first write to each page pays
		// for a full-page image, as after every checkpoint in production.
		// It needs superuser (or pg_checkpoint); without, the run goes on.
		if err := b.execAdmin(ctx, "CHECKPOINT"); err != nil {
			b.logf("could not checkpoint after the load (%v); the measurement may include it", err)
		}
	}
	took := time.Since(start)
	b.logf("preloaded %d keys in %s", b.cfg.Preload, took.Round(time.Millisecond))
	empty, err := b.spawn(ctx, "chargeonce-empty", kindChargeonce, emptyDB)
	if err != nil {
		return err
	}
	full, err := b.spawn(ctx, "chargeonce-preloaded", kindChargeonce, fullDB)
	if err != nil {
		return err
	}
	saved := b.ways
	defer func() { b.ways = saved }()
	b.ways = []*way{
		{name: "empty", server: empty, checksFlag: true, newClient: func() client { return newHTTPClient(empty.addr, b.secret) }},
		{name: "preloaded", server: full, checksFlag: true, newClient: func() client { return newHTTPClient(full.addr, b.secret) }},
	}
	rs, err := b.measureCell(ctx, WorkloadNew, b.ratioClients(), b.cfg.Warmup)
	if err != nil {
		return err
	}
	b.preloaded = &preloadResult{keys: b.cfg.Preload, took: took, empty: rs[0], full: rs[1]}
	b.logf("new at %d clients: empty %.0f req/s, %d keys %.0f req/s", rs[0].clients, rs[0].rps(), b.cfg.Preload, rs[1].rps())
	b.stopChildren()
	return nil
}

// fmtDur prints a latency compactly: µs below a millisecond, else ms.
func fmtDur(d time.Duration) string {
	if d < time.Millisecond {
		return fmt.Sprintf("%dµs", d.Microseconds())
	}
	return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
}
