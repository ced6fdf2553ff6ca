package main

import (
	"context"
	"fmt"
	"io"
	goruntime "runtime"
	"runtime/debug"

	"github.com/chargeonce/chargeonce/postgres"
	"github.com/chargeonce/chargeonce/sqlite"
)

// version and commit are the release this binary was built as and the
// commit it was built from. `make build` sets both from git: the version is
// `git describe` of the newest annotated release tag (v0.4.0 on the tag
// itself, v0.4.0-3-gabc1234 three commits after it, -dirty with uncommitted
// changes), so a checkout of a release builds as that release:
//
//	go build -ldflags "-X main.version=v0.4.0 -X main.commit=$(git rev-parse HEAD)" ./cmd/chargeonce
//
// Without them the version is the module version the go command stamped
// (`go install github.com/chargeonce/chargeonce/cmd/chargeonce@v0.4.0`, or
// `make install` in a clone: a pseudo-version of the commit), else "dev",
// and the commit the one it stamped (with its time), else "unknown".
var version, commit = "dev", ""

// buildInfo is what `chargeonce version` prints.
type buildInfo struct {
	Version string
	// Commit is the VCS revision the binary was built from, with -dirty when
	// the tree had uncommitted changes; "unknown" when the go command did not
	// stamp one (go run, go test).
	Commit string
	// CommitTime is the commit's time as the go command stamped it
	// (vcs.time, RFC 3339), empty when it did not or -ldflags named
	// another commit.
	CommitTime string
	// Postgres and SQLite are the schema versions each store migrates to.
	Postgres, SQLite int
	Go               string
}

// readBuildInfo combines the -ldflags version with what the go command
// stamped into the binary (bi may be nil: no build information).
func readBuildInfo(ldflagsVersion, ldflagsCommit string, bi *debug.BuildInfo) buildInfo {
	info := buildInfo{Version: ldflagsVersion, Commit: "unknown", Go: goruntime.Version()}
	if ldflagsCommit != "" {
		info.Commit = ldflagsCommit
	}
	if bi == nil {
		return info
	}
	if info.Version == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		info.Version = bi.Main.Version
	}
	var revision, at string
	var modified bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		case "vcs.time":
			at = s.Value
		}
	}
	if revision != "" && ldflagsCommit == "" {
		info.Commit = revision
		if modified {
			info.Commit += "-dirty"
		}
	}
	if revision != "" && (ldflagsCommit == "" || ldflagsCommit == revision) {
		info.CommitTime = at
	}
	if bi.GoVersion != "" {
		info.Go = bi.GoVersion
	}
	return info
}

func runVersion(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("version", stderr)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	bi, _ := debug.ReadBuildInfo()
	info := readBuildInfo(version, commit, bi)
	var err error
	if info.Postgres, err = postgres.SchemaVersion(); err != nil {
		return fmt.Errorf("reading the postgres store's migrations: %w", err)
	}
	if info.SQLite, err = sqlite.SchemaVersion(); err != nil {
		return fmt.Errorf("reading the sqlite store's migrations: %w", err)
	}
	commit := info.Commit
	if info.CommitTime != "" {
		commit += " (" + info.CommitTime + ")"
	}
	fmt.Fprintf(stdout, "version %s\ncommit  %s\nschema  postgres %d, sqlite %d\ngo      %s\n",
		info.Version, commit, info.Postgres, info.SQLite, info.Go)
	return nil
}
