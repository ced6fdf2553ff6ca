package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/xml"
	"errors"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/internal/pgtest"
)

// raceArgs is a small, fast workload: every attempt of an intent at once.
func raceArgs(db, dir string) []string {
	return []string{"race", "--db", db,
		"--intents", "3", "--attempts", "2", "--instances", "2", "--pool", "2",
		"--latency", "100ms", "--pause", "150ms", "--spread", "0", "--stagger", "0",
		"--svg", filepath.Join(dir, "race.svg"), "--csv", filepath.Join(dir, "race.csv"), "--refunds", "0"}
}

// `chargeonce race` races refunds too: with the naive design's worst
// interleaving forced, every one of 20 refunds of 60 on a captured 100 is
// paid; through insert-first exactly one is, and 19 are refused.
func TestRaceCommandRefundRace(t *testing.T) {
	t.Parallel()
	stdout, stderr, err := runMain(t, "race", "--db", pgtest.URL(t), "--strategy", "insert-first", "--pause", "0",
		"--intents", "1", "--attempts", "2", "--instances", "2", "--pool", "2", "--latency", "50ms",
		"--refunds", "20")
	if err != nil {
		t.Fatalf("race: %v\nstdout:\n%s\nstderr:\n%s", err, stdout, stderr)
	}
	t.Logf("output:\n%s", stdout)
	_, refunds, ok := strings.Cut(stdout, "Refund race:")
	if !ok {
		t.Fatalf("no refund race in:\n%s", stdout)
	}
	table, findings, _ := strings.Cut(refunds, "What the refund races show")
	rows := map[string][]string{}
	for _, line := range strings.Split(table, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) > 2 && f[0] == "read-then-insert" && f[1] == "(barrier)":
			rows["naive"] = f[2:]
		case len(f) > 1 && f[0] == "insert-first":
			rows["ours"] = f[1:]
		}
	}
	// Columns after the label: refunds succeeded refused paid-out captured over-refunded errors.
	for name, want := range map[string][]string{
		"naive": {"20", "20", "0", "1200", "100", "1100", "0"},
		"ours":  {"20", "1", "19", "60", "100", "0", "0"},
	} {
		if got := rows[name]; len(got) < len(want) || strings.Join(got[:len(want)], " ") != strings.Join(want, " ") {
			t.Errorf("%s row %v; want %v", name, got, want)
		}
	}
	if !strings.Contains(findings, "1100 paid back beyond what was captured") || !strings.Contains(findings, "exactly 1 refund of 60 was paid") {
		t.Errorf("the findings do not say it:\n%s", findings)
	}
}

func runMain(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	err = Main(ctx, args, &out, &errOut)
	return out.String(), errOut.String(), err
}

// `chargeonce race` on PostgreSQL runs the four runs, prints one row each,
// and writes a timeline with one lane per attempt of one intent per run,
// and every attempt's timings.
func TestRaceCommandOnPostgres(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	stdout, stderr, err := runMain(t, raceArgs(pgtest.URL(t), dir)...)
	if err != nil {
		t.Fatalf("race: %v\nstdout:\n%s\nstderr:\n%s", err, stdout, stderr)
	}
	t.Logf("output:\n%s", stdout)

	rows := map[string][]string{}
	table, _, _ := strings.Cut(stdout, "What the runs show")
	for _, line := range strings.Split(table, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		switch {
		case f[0] == "check-then-act" && f[1] == "--pause":
			rows["check-then-act --pause"] = f[2:]
		case f[0] == "check-then-act", f[0] == "locked-transaction", f[0] == "insert-first":
			rows[f[0]] = f[1:]
		}
	}
	// Columns after the label: intents attempts captures doubles p50 p99 max errors.
	want := map[string]struct{ captures, doubles string }{
		"check-then-act --pause": {"6", "3"}, // 150ms pause, attempts together: every intent doubles
		"locked-transaction":     {"3", "0"},
		"insert-first":           {"3", "0"},
	}
	if _, ok := rows["check-then-act"]; !ok {
		t.Errorf("no check-then-act row in:\n%s", stdout)
	}
	for label, w := range want {
		r, ok := rows[label]
		if label == "check-then-act --pause" && ok {
			r = r[1:] // the pause itself
		}
		if !ok || len(r) < 8 {
			t.Errorf("no complete %s row in:\n%s", label, stdout)
			continue
		}
		if r[0] != "3" || r[1] != "6" || r[2] != w.captures || r[3] != w.doubles || r[7] != "0" {
			t.Errorf("%s: intents %s, attempts %s, captures %s, doubles %s, errors %s; want 3, 6, %s, %s, 0",
				label, r[0], r[1], r[2], r[3], r[7], w.captures, w.doubles)
		}
	}

	b, err := os.ReadFile(filepath.Join(dir, "race.svg"))
	if err != nil {
		t.Fatal(err)
	}
	panels, lanes := countSVG(t, b)
	if panels != 4 || lanes != 4*2 {
		t.Errorf("SVG has %d panels and %d lanes; want 4 panels and one lane per attempt (8)", panels, lanes)
	}

	f, err := os.Open(filepath.Join(dir, "race.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	records, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatalf("reading the CSV: %v", err)
	}
	if len(records) != 1+4*6 {
		t.Errorf("CSV has %d rows; want a header and one row per attempt (%d)", len(records), 1+4*6)
	}
}

// countSVG parses b as XML, strictly, and counts its panels and lanes.
func countSVG(t *testing.T, b []byte) (panels, lanes int) {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(b))
	root := ""
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("the SVG is not well-formed XML: %v", err)
		}
		el, ok := tok.(xml.StartElement)
		if !ok {
			continue
		}
		if root == "" {
			root = el.Name.Local
		}
		for _, a := range el.Attr {
			if a.Name.Local == "class" && a.Value == "panel" {
				panels++
			}
			if a.Name.Local == "class" && a.Value == "lane" {
				lanes++
			}
		}
	}
	if root != "svg" {
		t.Fatalf("root element %q, want svg", root)
	}
	return panels, lanes
}

// On the embedded default every strategy runs, and the output says what
// SQLite's single writer does to each.
func TestRaceCommandOnSQLite(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	args := raceArgs("sqlite:"+filepath.Join(dir, "race.db"), dir)
	stdout, stderr, err := runMain(t, args...)
	if err != nil {
		t.Fatalf("race: %v\nstdout:\n%s\nstderr:\n%s", err, stdout, stderr)
	}
	for _, want := range []string{"on SQLite", "locked-transaction's BEGIN IMMEDIATE", "insert-first  "} {
		if !strings.Contains(stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, stdout)
		}
	}
}

// Bad flags fail before anything runs, naming the flag.
func TestRaceFlagsRejected(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--attempts", "1"}, "--attempts"},
		{[]string{"--intents", "0"}, "--intents"},
		{[]string{"--instances", "0"}, "--instances"},
		{[]string{"--pool", "0"}, "--pool"},
		{[]string{"--latency", "-1s"}, "--latency"},
		{[]string{"--pause", "-1s"}, "--pause"},
		{[]string{"--stagger", "-1ms"}, "--stagger"},
		{[]string{"--strategy", "optimistic"}, "--strategy"},
		{[]string{"--db", "mysql://x"}, "--db"},
	} {
		_, _, err := runMain(t, append([]string{"race"}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("race %v: error %v; want one naming %s", tc.args, err, tc.want)
		}
	}
}

// A database that does not exist is an error that says so, not a panic while
// closing the instances that never opened.
func TestRaceOnAMissingDatabase(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(pgtest.AdminURL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/chargeonce_no_such_database"
	missing := u.String()
	_, _, err = runMain(t, append(raceArgs(missing, t.TempDir()), "--instances", "3")...)
	if err == nil || !strings.Contains(err.Error(), "chargeonce_no_such_database") {
		t.Fatalf("race on a missing database: error %v; want one naming the database", err)
	}
}
