package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/chargeonce/chargeonce/internal/apitest"
)

// benchTestChild makes this test binary act as the chargeonce binary, so
// that `chargeonce bench` can start its servers (`chargeonce bench child
// …`, which runs the real `serve`) from a test. It is not a CHARGEONCE_*
// variable: the benchmark strips those from its children's environment.
const benchTestChild = "BENCH_TEST_RUN_MAIN"

func init() {
	if os.Getenv(benchTestChild) == "1" {
		main()
		os.Exit(0)
	}
}

// TestBenchRunsTheRealServe runs a tiny `chargeonce bench` on SQLite whose
// chargeonce server is `serve` itself, and checks the report: a row per
// workload, concurrency and way, no errors, no double charge, and the
// ratios line last.
func TestBenchRunsTheRealServe(t *testing.T) {
	// t.Setenv forbids t.Parallel: the children inherit the variable.
	t.Setenv(benchTestChild, "1")
	path := filepath.Join(t.TempDir(), "bench.db")
	var out, errb apitest.Buffer
	err := Main(context.Background(), []string{"bench", "--db", "sqlite:" + path,
		"--duration", "100ms", "--rounds", "2", "--warmup", "10ms", "--concurrency", "2",
		"--group", "2", "--replay-keys", "20", "--preload", "200"}, &out, &errb)
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, errb.String())
	}
	report := out.String()
	lines := strings.Split(strings.TrimRight(report, "\n"), "\n")
	if !regexp.MustCompile(`^ratios: new=\d+\.\d\d replay=\d+\.\d\d contended=\d+\.\d\d new_vs_minimal=\d+\.\d\d contended_vs_minimal=\d+\.\d\d$`).MatchString(lines[len(lines)-1]) {
		t.Fatalf("last line %q is not the ratios line\n%s", lines[len(lines)-1], report)
	}
	for _, wl := range []string{"new", "replay", "contended"} {
		for _, way := range []string{"chargeonce", "bare-http", "raw-sql", "minimal"} {
			if way == "minimal" && wl == "replay" {
				continue // the minimal design has no stored responses to replay
			}
			if !regexp.MustCompile(`(?m)^\s*` + wl + `\s+2\s+` + way + `\s+[1-9]\d*\s+\S+\s+\S+\s+0\s`).MatchString(report) {
				t.Errorf("no error-free row for %s, %s\n%s", wl, way, report)
			}
		}
	}
	// The statistics come from the simulator `serve` mounts under
	// /acquirer: proof that the chargeonce server was serve itself.
	for _, want := range []string{"0 keys with more than one charge", "0 duplicate requests", "with 200 keys already in the table"} {
		if !strings.Contains(report, want) {
			t.Errorf("the report lacks %q\n%s", want, report)
		}
	}
	if m, _ := filepath.Glob(path + "*"); len(m) != 0 {
		t.Errorf("the run left %v behind", m)
	}
}

func TestBenchBadFlagsNameTheFlag(t *testing.T) {
	t.Parallel()
	existing := filepath.Join(t.TempDir(), "x.db")
	if err := os.WriteFile(existing, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--db", "mysql://x"}, "--db"},
		{[]string{"bench", "--db", "sqlite:" + existing}, "--db"},
		{[]string{"bench", "--concurrency", "1,zero"}, "--concurrency"},
		{[]string{"bench", "--workloads", "new,old"}, "--workloads"},
		{[]string{"bench", "--duration", "0s"}, "--duration"},
		{[]string{"bench", "--group", "1"}, "--group"},
		{[]string{"bench", "stray"}, "unexpected argument"},
	} {
		var out, errb apitest.Buffer
		err := Main(context.Background(), tc.args, &out, &errb)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one naming %s", tc.args, err, tc.want)
		}
	}
}

// --webhooks adds the way chargeonce+webhooks, a real serve whose merchant
// has an endpoint on loopback: its deliveries are received, each of its
// slices waits for them (so that they are not measured under the next
// way's load), and the report prints its cost against chargeonce without
// an endpoint.
func TestBenchWebhooksRunsTheRealServe(t *testing.T) {
	t.Setenv(benchTestChild, "1")
	path := filepath.Join(t.TempDir(), "bench.db")
	var out, errb apitest.Buffer
	err := Main(context.Background(), []string{"bench", "--db", "sqlite:" + path, "--webhooks",
		"--duration", "200ms", "--rounds", "2", "--warmup", "10ms", "--concurrency", "2",
		"--group", "2", "--workloads", "new,contended", "--preload", "0"}, &out, &errb)
	if err != nil {
		t.Fatalf("bench --webhooks: %v\n%s", err, errb.String())
	}
	report := out.String()
	m := regexp.MustCompile(`webhooks \(a merchant with an endpoint on loopback; (\d+) deliveries received, every one answered 204;\n  each slice of the way waits for its deliveries and counts that time: up to (\d+) pending at a slice's end, drained in up to ([^)]+)\)`).FindStringSubmatch(report)
	if m == nil {
		t.Fatalf("the report lacks the webhooks section with its drain\n%s", report)
	}
	if m[1] == "0" {
		t.Errorf("no delivery received\n%s", report)
	}
	for _, wl := range []string{"new", "contended"} {
		if !regexp.MustCompile(wl + ` at 2 clients: [1-9]\d* req/s \(p99 [^)]+\) against [1-9]\d* req/s \(p99 [^)]+\) without an endpoint: \d+\.\d\d`).MatchString(report) {
			t.Errorf("the report lacks the webhooks cost of %s\n%s", wl, report)
		}
		if !regexp.MustCompile(wl + ` at 2 clients: .*\n    while the load ran: \d+ settlements/s, \d+ deliveries/s \(\d+\.\d\d\); pending when the load stopped: \d+ \(last slice\), \d+ at most`).MatchString(report) {
			t.Errorf("the report lacks the settlements and deliveries per second of %s\n%s", wl, report)
		}
	}
}
