package bench

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/chargeonce/chargeonce/internal/pgtest"
	"github.com/chargeonce/chargeonce/postgres"
)

// The postgres CPU column is the CPU of the server the run writes to: its
// backends' work shows in it, including a backend's that exited between
// two samples, and another process named postgres (a test's throwaway
// cluster beside the benchmark) does not. Counting every process named
// postgres made the column negative whenever such a process exited
// during a slice.
func TestPostgresCPUIsTheRunsServer(t *testing.T) {
	ctx := context.Background()
	store, err := postgres.Open(ctx, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	pm := findPostmaster(ctx, store)
	if pm == 0 {
		t.Fatal("findPostmaster found no postmaster for a server on this machine")
	}
	if c := comm(pm); c != "postgres" {
		t.Fatalf("postmaster %d is %q, not postgres", pm, c)
	}

	// A backend's work counts, and keeps counting once it has exited:
	// sampled before its exit and after, the server's CPU does not fall
	// (counting living processes only, it fell by all the backend had
	// done, and a run's column went negative).
	cfg := store.Pool().Config().ConnConfig.Copy()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid() FROM (SELECT count(*) FROM generate_series(1, 8000000)) s").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	worked := processCPU(pid, false)
	if worked < 200*time.Millisecond {
		t.Fatalf("the backend's count took only %s of CPU: the check below would prove little", worked)
	}
	before := postgresCPU(pm)
	if before < worked {
		t.Fatalf("the server's CPU, %s, is less than one backend's, %s", before, worked)
	}
	_ = conn.Close(ctx) // the backend exits
	for range 100 {     // until the postmaster has reaped it
		if comm(pid) == "" {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if after := postgresCPU(pm); after < before-20*time.Millisecond {
		t.Fatalf("a backend that worked %s exited: the server's CPU fell from %s to %s", worked, before, after)
	}

	// The processes counted are the server's: a backend of it, and not
	// another process named postgres (as another cluster's are).
	var backend int
	if err := store.Pool().QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		t.Fatal(err)
	}
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	fake := filepath.Join(t.TempDir(), "postgres")
	b, err := os.ReadFile(sh)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(fake, b, 0o755); err != nil { //nolint:gosec // G306: an executable copy of sh
		t.Fatal(err)
	}
	other := exec.CommandContext(ctx, fake, "-c", "sleep 5")
	if err := other.Start(); err != nil {
		t.Fatalf("starting a process named postgres: %v", err)
	}
	defer func() { _ = other.Process.Kill(); _ = other.Wait() }()
	for range 100 {
		if comm(other.Process.Pid) == "postgres" {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if c := comm(other.Process.Pid); c != "postgres" {
		t.Fatalf("the other process is named %q: the check below would prove nothing", c)
	}
	counted := children(pm)
	if !slices.Contains(counted, backend) {
		t.Errorf("backend %d is not among the processes counted, %v", backend, counted)
	}
	if slices.Contains(counted, other.Process.Pid) {
		t.Errorf("another process named postgres (%d) is counted as the server's", other.Process.Pid)
	}
}
