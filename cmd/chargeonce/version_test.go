package main

import (
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
)

func TestReadBuildInfo(t *testing.T) {
	t.Parallel()
	vcs := func(rev, modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}, {Key: "vcs.time", Value: "2026-12-07T23:37:09Z"}}
	}
	for _, tc := range []struct {
		name        string
		ldflags     string
		ldCommit    string
		bi          *debug.BuildInfo
		wantVersion string
		wantCommit  string
	}{
		{"no build information", "dev", "", nil, "dev", "unknown"},
		{"go run: no module version, no vcs", "dev", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "dev", "unknown"},
		{"a tagged checkout", "dev", "", &debug.BuildInfo{Main: debug.Module{Version: "v0.3.0"}, Settings: vcs("abc123", "false")}, "v0.3.0", "abc123"},
		{"uncommitted changes", "dev", "", &debug.BuildInfo{Main: debug.Module{Version: "v0.3.1-0.20261204154300-abc123abc123+dirty"}, Settings: vcs("abc123", "true")}, "v0.3.1-0.20261204154300-abc123abc123+dirty", "abc123-dirty"},
		{"-ldflags wins", "v1.2.3", "", &debug.BuildInfo{Main: debug.Module{Version: "v0.3.0"}, Settings: vcs("abc123", "false")}, "v1.2.3", "abc123"},
		{"make build: -ldflags with -buildvcs=false", "v0.4.0-3-gdef456", "def456", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "v0.4.0-3-gdef456", "def456"},
	} {
		got := readBuildInfo(tc.ldflags, tc.ldCommit, tc.bi)
		if got.Version != tc.wantVersion || got.Commit != tc.wantCommit {
			t.Errorf("%s: version %q, commit %q; want %q, %q", tc.name, got.Version, got.Commit, tc.wantVersion, tc.wantCommit)
		}
		// The commit's time comes with the stamped commit, never with
		// another one -ldflags named.
		wantTime := ""
		if tc.bi != nil && len(tc.bi.Settings) > 0 && strings.TrimSuffix(tc.wantCommit, "-dirty") == "abc123" {
			wantTime = "2026-12-07T23:37:09Z"
		}
		if got.CommitTime != wantTime {
			t.Errorf("%s: commit time %q; want %q", tc.name, got.CommitTime, wantTime)
		}
	}
}

// newestMigration is the highest NNNN of dir/NNNN_*.sql, read from the source
// tree, for the test to hold SchemaVersion against.
func newestMigration(t *testing.T, dir string) int {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "*.sql"))
	if err != nil || len(names) == 0 {
		t.Fatalf("no migrations in %s (%v)", dir, err)
	}
	newest := 0
	for _, n := range names {
		num, _, _ := strings.Cut(filepath.Base(n), "_")
		v, err := strconv.Atoi(num)
		if err != nil {
			t.Fatalf("migration %s: %v", n, err)
		}
		newest = max(newest, v)
	}
	return newest
}

func wantSchemaLine(t *testing.T) string {
	t.Helper()
	return "schema  postgres " + strconv.Itoa(newestMigration(t, "../../postgres/migrations")) +
		", sqlite " + strconv.Itoa(newestMigration(t, "../../sqlite/migrations"))
}

// `chargeonce version` prints the schema version of each store: the newest
// migration it embeds.
func TestVersionCommand(t *testing.T) {
	t.Parallel()
	out, errOut, err := runMain(t, "version")
	if err != nil {
		t.Fatalf("chargeonce version: %v (%s)", err, errOut)
	}
	for _, want := range []string{"version ", "commit  ", wantSchemaLine(t), "go      go1."} {
		if !strings.Contains(out, want) {
			t.Errorf("chargeonce version printed\n%s\nwant a line with %q", out, want)
		}
	}
	if _, _, err := runMain(t, "version", "extra"); err == nil {
		t.Error("chargeonce version extra: no error")
	}
}
