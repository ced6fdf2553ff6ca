package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// A resolve without --reason (or --status) is a command line chargeonce
// cannot run: exit 2 before the admin API is called, as every usage error,
// where the admin API's 400 made it exit 1.
func TestResolveWithoutReasonOrStatusIsAUsageError(t *testing.T) {
	t.Parallel()
	keyFile := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(keyFile, []byte("ak_test_demo\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"resolve", "ch_01a2", "--status", "captured"},
		{"resolve", "ch_01a2", "--status", "captured", "--reason", "  "},
		{"resolve", "re_01a2", "--reason", "ticket 52"},
	} {
		args = append(args, "--admin-key-file", keyFile, "--admin-url", "http://127.0.0.1:1", "--timeout", "2s")
		_, errOut, err := runMain(t, args...)
		if !errors.As(err, new(usageError)) {
			t.Errorf("chargeonce %s: %v (%q); want a usage error (exit 2)", strings.Join(args, " "), err, errOut)
		}
	}
}

// The summaries of the commands that act on refunds, captures and cancels
// too say so: `chargeonce help` said "charge" only for resolve, publish
// and worker.
func TestCommandSummariesNameEveryKind(t *testing.T) {
	t.Parallel()
	for _, c := range commands() {
		switch c.name {
		case "resolve", "publish", "worker":
			for _, kind := range []string{"refund", "capture", "cancel"} {
				if !strings.Contains(c.summary, kind) {
					t.Errorf("%s's summary %q does not say it handles a %s", c.name, c.summary, kind)
				}
			}
		}
	}
}

// `make install` puts a chargeonce on GOBIN that says which build it is
// from the module's build information when no release stamp is there: a
// module version (not dev), the commit it was built from and that commit's
// time, which the go command stamps (vcs.revision, vcs.time) — also where
// GOFLAGS says -buildvcs=false, as go env -w leaves it on some machines. It
// builds a clone of HEAD (a git worktree's .git file is not stamped) with
// this tree's Makefile.
func TestInstalledBinarySaysWhichBuild(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	clone := filepath.Join(t.TempDir(), "chargeonce")
	git := func(dir string, args ...string) string {
		t.Helper()
		out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	git(root, "clone", "-q", "--no-local", root, clone)
	head := git(clone, "rev-parse", "HEAD")
	at, err := time.Parse(time.RFC3339, git(clone, "log", "-1", "--format=%cI"))
	if err != nil {
		t.Fatal(err)
	}
	gobin := t.TempDir()
	install := exec.Command("make", "-s", "-C", clone, "-f", filepath.Join(root, "Makefile"), "install")
	install.Env = append(os.Environ(), "GOBIN="+gobin, "GOFLAGS=-buildvcs=false")
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("make install: %v\n%s", err, out)
	}
	out, err := exec.Command(filepath.Join(gobin, "chargeonce"), "version").CombinedOutput()
	if err != nil {
		t.Fatalf("chargeonce version: %v\n%s", err, out)
	}
	want := "commit  " + head + " (" + at.UTC().Format(time.RFC3339) + ")\n"
	if !strings.Contains(string(out), want) {
		t.Errorf("the installed chargeonce's version says\n%s\nwant the line %q", out, want)
	}
	if v := regexp.MustCompile(`(?m)^version (\S+)`).FindStringSubmatch(string(out)); v == nil || v[1] == "dev" {
		t.Errorf("the installed chargeonce's version says\n%s\nwant the module version the go command stamped, not dev", out)
	}
}
