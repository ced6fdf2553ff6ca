package main

import (
	"context"
	"errors"
	"flag"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/internal/apitest"
)

// `chargeonce version`, `--version` and `-v` print the same lines and exit 0.
func TestVersionSpellings(t *testing.T) {
	t.Parallel()
	want, _, err := runMain(t, "version")
	if err != nil {
		t.Fatalf("chargeonce version: %v", err)
	}
	for _, spelling := range []string{"--version", "-version", "-v"} {
		out, errOut, err := runMain(t, spelling)
		if err != nil || out != want {
			t.Errorf("chargeonce %s: %v, printed %q (stderr %q); want %q", spelling, err, out, errOut, want)
		}
	}
}

// A bad flag says what was wrong and where help is, in two lines, not the
// whole flag list; `-h` still prints the list and is not an error.
func TestBadFlagPointsToHelp(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"serve", "acquirer", "migrate", "reconcile", "bench", "charge", "race", "worker", "publish", "resolve", "version"} {
		var out, errb apitest.Buffer
		err := Main(context.Background(), []string{name, "--no-such-flag"}, &out, &errb)
		if err == nil || !errors.As(err, new(usageError)) {
			t.Errorf("%s --no-such-flag: error %v, want a usage error (exit 2)", name, err)
			continue
		}
		msg := errorLine(err)
		if !strings.Contains(msg, "-no-such-flag") || !strings.Contains(msg, "chargeonce "+name+" -h") {
			t.Errorf("%s --no-such-flag: %q; want the flag and a pointer to 'chargeonce %s -h'", name, msg, name)
		}
		if lines := strings.Count(msg+"\n"+errb.String(), "\n"); lines > 2 || out.String() != "" {
			t.Errorf("%s --no-such-flag printed %d lines:\n%s\n%s%s", name, lines, msg, errb.String(), out.String())
		}
		var helpOut apitest.Buffer
		if err := Main(context.Background(), []string{name, "-h"}, &out, &helpOut); !errors.Is(err, flag.ErrHelp) || !strings.Contains(helpOut.String(), "usage: chargeonce "+name) {
			t.Errorf("%s -h: %v, printed %q", name, err, helpOut.String())
		}
	}
	var out, errb apitest.Buffer
	err := Main(context.Background(), []string{"frobnicate"}, &out, &errb)
	if msg := errorLine(err); !strings.Contains(msg, "frobnicate") || !strings.Contains(msg, "chargeonce help") || strings.Count(msg+errb.String(), "\n") > 1 {
		t.Errorf("an unknown command: %q then %q; want the error and one line pointing to help", msg, errb.String())
	}
}

// The listen addresses chargeonce's commands default to, and the operators'
// listener docs/operators.md shows, are all different: the README's
// three-process demo (serve, acquirer, admin) starts with no port clash, and
// `resolve` finds the admin API where docs/operators.md puts it.
func TestDefaultPortsDistinct(t *testing.T) {
	t.Parallel()
	admin, err := url.Parse(DefaultAdminURL)
	if err != nil {
		t.Fatal(err)
	}
	ops, err := os.ReadFile("../../docs/operators.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`--admin-addr (\S+)`).FindSubmatch(ops)
	if m == nil {
		t.Fatal("docs/operators.md shows no --admin-addr")
	}
	if string(m[1]) != admin.Host {
		t.Errorf("docs/operators.md serves the admin API on %s, resolve's --admin-url defaults to %s", m[1], DefaultAdminURL)
	}
	seen := map[string]string{}
	for name, addr := range map[string]string{"serve --addr": DefaultAddr, "acquirer --addr": DefaultAcquirerAddr, "the admin listener": admin.Host} {
		if other, ok := seen[addr]; ok {
			t.Errorf("%s and %s both default to %s", name, other, addr)
		}
		seen[addr] = name
	}
}

// helpFlag is one flag as `chargeonce <command> -h` lists it.
type helpFlag struct {
	usage, def string
}

// helpFlags runs `chargeonce name -h` and returns its flags.
func helpFlags(t *testing.T, name string) map[string]helpFlag {
	t.Helper()
	var out, errb apitest.Buffer
	if err := Main(context.Background(), []string{name, "-h"}, &out, &errb); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("chargeonce %s -h: %v", name, err)
	}
	flags := map[string]helpFlag{}
	head := regexp.MustCompile(`^  -([a-z0-9-]+)`)
	def := regexp.MustCompile(`\(default "?([^")]*)"?\)\s*$`)
	cur := ""
	for line := range strings.Lines(errb.String()) {
		if m := head.FindStringSubmatch(line); m != nil {
			cur = m[1]
			flags[cur] = helpFlag{}
			continue
		}
		if cur == "" {
			continue
		}
		f := flags[cur]
		f.usage += line
		if m := def.FindStringSubmatch(line); m != nil {
			f.def = m[1]
		}
		flags[cur] = f
	}
	if len(flags) == 0 && name != "version" {
		t.Fatalf("chargeonce %s -h lists no flags:\n%s", name, errb.String())
	}
	return flags
}

// sameDefault reports whether a documented default is what -h says, reading
// both as durations when they are (docs write 1m, -h 1m0s).
func sameDefault(doc, help string) bool {
	if doc == help {
		return true
	}
	d1, err1 := time.ParseDuration(doc)
	d2, err2 := time.ParseDuration(help)
	return err1 == nil && err2 == nil && d1 == d2
}

// TestDocumentedFlags runs each documented command's -h and checks the docs
// against it: every flag the README and docs/ pass to `chargeonce <command>`
// exists on that command; every row of docs/operations.md's `serve` table is
// a flag of serve's with the default it states; and a flag written with a
// default in prose ("`--timeout`, 1m") has that default on a command that
// takes it.
func TestDocumentedFlags(t *testing.T) {
	t.Parallel()
	help := map[string]map[string]helpFlag{}
	for _, c := range commands() {
		help[c.name] = helpFlags(t, c.name)
	}
	docs, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	docs = append(docs, "../../README.md")
	invocation := regexp.MustCompile(`chargeonce ([a-z]+)\b`)
	flagRe := regexp.MustCompile(`(?:^|[\s\[\x60(])--([a-z][a-z0-9-]*)`)
	withDefault := regexp.MustCompile("`--([a-z][a-z0-9-]*)`(?:,| \\(|) ([0-9][0-9a-z.]*(?:ms|s|m|h))\\b")
	var names []string
	for _, c := range commands() {
		names = append(names, c.name)
	}
	commandNamed := regexp.MustCompile("(?:chargeonce |`)(" + strings.Join(names, "|") + ")\\b")
	checked := 0
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Base(doc)
		lines := strings.Split(string(b), "\n")
		paragraph := ""
		for i := 0; i < len(lines); i++ {
			line := lines[i]
			// A shell command continued with a backslash is one command.
			for strings.HasSuffix(strings.TrimSpace(line), `\`) && i+1 < len(lines) {
				i++
				line = strings.TrimSuffix(strings.TrimSpace(line), `\`) + " " + lines[i]
			}
			for _, loc := range invocation.FindAllStringSubmatchIndex(line, -1) {
				cmd := line[loc[2]:loc[3]]
				flags, ok := help[cmd]
				if !ok {
					continue
				}
				rest := line[loc[1]:]
				// The invocation ends with its code span, or with the line
				// in a code block.
				if j := strings.IndexByte(rest, '`'); j >= 0 {
					rest = rest[:j]
				}
				if j := strings.Index(rest, "chargeonce "); j >= 0 {
					rest = rest[:j]
				}
				for _, m := range flagRe.FindAllStringSubmatch(rest, -1) {
					checked++
					if _, ok := flags[m[1]]; !ok {
						t.Errorf("%s: `chargeonce %s --%s`, but chargeonce %s -h has no --%s", name, cmd, m[1], cmd, m[1])
					}
				}
			}
			if strings.TrimSpace(line) == "" {
				paragraph = ""
			}
			paragraph += line + "\n"
			for _, loc := range withDefault.FindAllStringSubmatchIndex(paragraph, -1) {
				flagName, def := paragraph[loc[2]:loc[3]], paragraph[loc[4]:loc[5]]
				if loc[0] < len(paragraph)-len(line)-1 {
					continue // an earlier line's, checked already
				}
				// The command is the one the paragraph last named before
				// the flag; any command with the flag when it names none.
				cands := commands()
				if ms := commandNamed.FindAllStringSubmatch(paragraph[:loc[0]], -1); len(ms) > 0 {
					last := ms[len(ms)-1][1]
					if _, ok := help[last][flagName]; ok {
						cands = []command{{name: last}}
					}
				}
				found, match := false, false
				var defaults []string
				for _, c := range cands {
					if f, ok := help[c.name][flagName]; ok {
						found = true
						defaults = append(defaults, c.name+": "+f.def)
						match = match || sameDefault(def, f.def)
					}
				}
				checked++
				if found && !match {
					t.Errorf("%s: `--%s` with a default of %s, but -h says %v", name, flagName, def, defaults)
				}
			}
		}
	}
	ops, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, _ := strings.Cut(string(ops), "## Configuration")
	table, _, _ = strings.Cut(table, "\n\n"+"The other commands")
	row := regexp.MustCompile("(?m)^\\| `--([a-z0-9-]+)`(?:, `--([a-z0-9-]+)`)? \\| ([^|]*) \\|")
	rows := row.FindAllStringSubmatch(table, -1)
	if len(rows) < 10 {
		t.Fatalf("docs/operations.md's serve table has %d rows", len(rows))
	}
	for _, r := range rows {
		f, ok := help["serve"][r[1]]
		if !ok {
			t.Errorf("docs/operations.md lists --%s, but chargeonce serve -h has no --%s", r[1], r[1])
			continue
		}
		if r[2] != "" {
			if _, ok := help["serve"][r[2]]; !ok {
				t.Errorf("docs/operations.md lists --%s, but chargeonce serve -h has no --%s", r[2], r[2])
			}
			continue
		}
		cell := strings.TrimSpace(r[3])
		if d, ok := strings.CutPrefix(cell, "`"); ok && strings.HasSuffix(d, "`") && !strings.Contains(d[:len(d)-1], "`") && f.def != "" {
			checked++
			if d = strings.TrimSuffix(d, "`"); !sameDefault(d, f.def) {
				t.Errorf("docs/operations.md: --%s defaults to %s, chargeonce serve -h says %s", r[1], d, f.def)
			}
		}
	}
	if checked < 50 {
		t.Errorf("checked %d documented flags; the docs name more", checked)
	}
	t.Logf("checked %d documented flags against -h", checked)
}

// `make build` stamps the binary with `git describe` of the newest annotated
// release tag and the commit: the Makefile's recipe, run in a repository
// whose HEAD is tagged v9.9.9 (make -n), passes that tag; and a binary built
// by the recipe prints what it was given (a -X on a misspelt variable would
// silently do nothing).
func TestMakeBuildStampsTheReleaseTag(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	repo := t.TempDir()
	git := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-C", repo, "-c", "user.name=t", "-c", "user.email=t@example.com"}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	git("init", "-q")
	git("commit", "-q", "--allow-empty", "-m", "release")
	git("tag", "-a", "v9.9.9", "-m", "v9.9.9")
	head := git("rev-parse", "HEAD")
	out, err := exec.Command("make", "-s", "-n", "-C", repo, "-f", filepath.Join(root, "Makefile"), "build").CombinedOutput()
	if err != nil {
		t.Fatalf("make -n build: %v\n%s", err, out)
	}
	if want := "-X main.version=v9.9.9 -X main.commit=" + head; !strings.Contains(string(out), want) {
		t.Errorf("make build on a commit tagged v9.9.9 runs\n%s\nwant %q", out, want)
	}
	bin := filepath.Join(t.TempDir(), "chargeonce")
	if out, err := exec.Command("make", "-s", "-C", root, "build", "VERSION=v9.9.9-test", "COMMIT=abc123", "BIN="+bin).CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	out, err = exec.Command(bin, "-v").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "version v9.9.9-test\ncommit  abc123\n") {
		t.Errorf("the built binary's -v: %v\n%s", err, out)
	}
}
