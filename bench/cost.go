package bench

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/postgres"
)

// userHZ is the unit of the CPU times in /proc/PID/stat (USER_HZ, 100 on
// every Linux the benchmark runs on).
const userHZ = 100

// costSample is a reading of what the database server and a way's server
// process had done at one moment. Differences of two samples taken around
// a slice are what that slice cost; divided by its requests, what one
// charge costs — the why behind the req/s.
type costSample struct {
	// wal is pg_current_wal_insert_lsn() in bytes: WAL written so far.
	wal int64
	// xid is the next transaction id: every transaction that writes takes
	// one, so its growth counts the commits of writing transactions.
	xid int64
	// pgCPU is the CPU time of the PostgreSQL server the run writes to:
	// its postmaster, background processes and backends (zero when the
	// server runs elsewhere).
	pgCPU time.Duration
	// serverCPU is the CPU time of the way's server process.
	serverCPU time.Duration
	pg        bool // wal and xid were read
}

// cost accumulates what a way's measured slices cost.
type cost struct {
	wal, xid         int64
	pgCPU, serverCPU time.Duration
	pg, pgProcs      bool
	server           bool
}

func (c *cost) add(before, after costSample, pgProcs, server bool) {
	c.pg = before.pg && after.pg
	c.pgProcs = pgProcs
	c.server = server
	c.wal += after.wal - before.wal
	c.xid += after.xid - before.xid
	c.pgCPU += after.pgCPU - before.pgCPU
	c.serverCPU += after.serverCPU - before.serverCPU
}

// sampleCost reads the counters behind costSample for way w. Failures
// leave fields zero: the report then says n/a rather than failing a run
// over a statistic.
func (b *bench) sampleCost(ctx context.Context, w *way) costSample {
	var s costSample
	if b.parent != nil {
		if ps, ok := b.parent.store.(*postgres.Store); ok {
			err := ps.Pool().QueryRow(ctx, `
SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint,
       pg_snapshot_xmax(pg_current_snapshot())::text::bigint`).Scan(&s.wal, &s.xid)
			s.pg = err == nil
		}
	}
	if b.parent != nil {
		s.pgCPU = postgresCPU(b.parent.postmaster)
	}
	if w.server != nil {
		s.serverCPU = processCPU(w.server.pid(), false)
	}
	return s
}

// processCPU returns the user+system CPU time of process pid, or zero;
// with children, that of its exited children too (the kernel adds them
// to a parent once it has waited for them).
func processCPU(pid int, children bool) time.Duration {
	if pid <= 0 {
		return 0
	}
	f := statFields(pid)
	if len(f) < 15 {
		return 0
	}
	// utime, stime, cutime, cstime: fields 14–17 of stat, 12–15 here.
	n := 2
	if children {
		n = 4
	}
	var ticks int64
	for _, v := range f[11 : 11+n] {
		t, _ := strconv.ParseInt(string(v), 10, 64)
		ticks += t
	}
	return time.Duration(ticks) * time.Second / userHZ
}

// statFields returns the fields of /proc/PID/stat after the command name
// (which may hold spaces), field 3 (state) first; nil when pid is gone.
func statFields(pid int) [][]byte {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return nil
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil
	}
	return bytes.Fields(b[i+1:])
}

// findPostmaster returns the pid of the PostgreSQL server that store's
// connections reach, when it runs on this machine: the parent of a
// backend serving one of them. Zero for SQLite, a server elsewhere (the
// backend's pid names no process here, or a process of another server)
// or a pooler between.
func findPostmaster(ctx context.Context, store chargeonce.Store) int {
	ps, ok := store.(*postgres.Store)
	if !ok {
		return 0
	}
	var backend int
	if err := ps.Pool().QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		return 0
	}
	if comm(backend) != "postgres" {
		return 0
	}
	f := statFields(backend)
	if len(f) < 2 {
		return 0
	}
	ppid, err := strconv.Atoi(string(f[1]))
	if err != nil || comm(ppid) != "postgres" {
		return 0
	}
	return ppid
}

// comm is process pid's command name, "" when it is gone.
func comm(pid int) string {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm"))
	if err != nil {
		return ""
	}
	return string(bytes.TrimSpace(b))
}

// postgresCPU returns the CPU time of the PostgreSQL server whose
// postmaster is pid: the postmaster's own and its exited children's, and
// every living child's (background processes and backends). Other
// servers on the machine (a test's throwaway cluster) are not counted.
func postgresCPU(postmaster int) time.Duration {
	if postmaster <= 0 {
		return 0
	}
	total := processCPU(postmaster, true)
	for _, pid := range children(postmaster) {
		total += processCPU(pid, false)
	}
	return total
}

// children returns the pids of process parent's living children.
func children(parent int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	want := strconv.Itoa(parent)
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f := statFields(pid); len(f) >= 2 && string(f[1]) == want {
			pids = append(pids, pid)
		}
	}
	return pids
}
