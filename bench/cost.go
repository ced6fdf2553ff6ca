package bench

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"time"

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
	// pgCPU is the CPU time of the PostgreSQL processes on this machine
	// (zero when the server runs elsewhere).
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
	s.pgCPU = postgresCPU()
	if w.server != nil {
		s.serverCPU = processCPU(w.server.pid())
	}
	return s
}

// processCPU returns the user+system CPU time of process pid, or zero.
func processCPU(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0
	}
	// The command name (field 2) may hold spaces; fields after its closing
	// parenthesis are fixed: utime and stime are the 12th and 13th.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(string(f[11]), 10, 64)
	st, _ := strconv.ParseInt(string(f[12]), 10, 64)
	return time.Duration(ut+st) * time.Second / userHZ
}

// postgresCPU returns the CPU time of every process named postgres on
// this machine: the server, its background workers and every backend.
func postgresCPU() time.Duration {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	var total time.Duration
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err != nil || string(bytes.TrimSpace(comm)) != "postgres" {
			continue
		}
		total += processCPU(pid)
	}
	return total
}
