package main

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/internal/apitest"
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
// builds this tree; in a git worktree, whose .git file the go command does
// not stamp from, a clone of HEAD with this tree's Makefile.
func TestInstalledBinarySaysWhichBuild(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	git := func(dir string, args ...string) string {
		t.Helper()
		out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	clone := root
	if fi, err := os.Stat(filepath.Join(root, ".git")); err != nil || !fi.IsDir() {
		clone = filepath.Join(t.TempDir(), "chargeonce")
		git(root, "clone", "-q", "--no-local", root, clone)
	}
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
	// -dirty when the tree being tested has uncommitted changes.
	want := regexp.MustCompile(`(?m)^commit  ` + head + `(-dirty)? \(` + regexp.QuoteMeta(at.UTC().Format(time.RFC3339)) + `\)$`)
	if !want.Match(out) {
		t.Errorf("the installed chargeonce's version says\n%s\nwant the line %q", out, want)
	}
	if v := regexp.MustCompile(`(?m)^version (\S+)`).FindStringSubmatch(string(out)); v == nil || v[1] == "dev" {
		t.Errorf("the installed chargeonce's version says\n%s\nwant the module version the go command stamped, not dev", out)
	}
}

// /metrics counts a refund's, a capture's and a cancel's attempts by their
// kind, not as charge attempts: chargeonce_charge_attempts_total counted
// every one of them as a POST /v1/charges answer.
func TestMetricsCountOperationsByKind(t *testing.T) {
	t.Parallel()
	r := startServe(t, "127.0.0.1:0")
	post := func(path, key, body string) apitest.Result {
		t.Helper()
		res, err := apitest.Do(t, nil, "POST", r.base+path, []byte(body),
			map[string]string{"Authorization": "Bearer sk_test_demo", "Idempotency-Key": key})
		if err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
		return res
	}
	idOf := func(res apitest.Result) string {
		t.Helper()
		var v struct{ ID string }
		if err := json.Unmarshal(res.Body, &v); err != nil || v.ID == "" {
			t.Fatalf("no id in %d %s", res.Status, res.Body)
		}
		return v.ID
	}
	captured := post("/v1/charges", "m-1", `{"order_id": 1, "amount_cents": 1000, "payment_token": "tok_ok"}`)
	toCapture := post("/v1/charges", "m-2", `{"order_id": 2, "amount_cents": 1000, "payment_token": "tok_ok", "capture_method": "manual"}`)
	toCancel := post("/v1/charges", "m-3", `{"order_id": 3, "amount_cents": 1000, "payment_token": "tok_ok", "capture_method": "manual"}`)
	for _, op := range []struct {
		path string
		want int
	}{
		{"/v1/charges/" + idOf(captured) + "/refunds", 201},
		{"/v1/charges/" + idOf(toCapture) + "/capture", 200},
		{"/v1/charges/" + idOf(toCancel) + "/cancel", 200},
	} {
		if res := post(op.path, "op-"+op.path, `{}`); res.Status != op.want {
			t.Fatalf("POST %s: %d %s", op.path, res.Status, res.Body)
		}
	}
	body := string(get(t, r.base+"/metrics", "").Body)
	total := 0
	for _, m := range regexp.MustCompile(`(?m)^chargeonce_charge_attempts_total\{[^}]*\} (\d+)$`).FindAllStringSubmatch(body, -1) {
		n, _ := strconv.Atoi(m[1])
		total += n
	}
	if total != 3 {
		t.Errorf("chargeonce_charge_attempts_total sums to %d after 3 charges, a refund, a capture and a cancel; want 3\n%s", total, grepLines(body, "attempts_total"))
	}
	for _, want := range []string{
		`chargeonce_operation_attempts_total{kind="refund",replayed="false",status="201"} 1`,
		`chargeonce_operation_attempts_total{kind="capture",replayed="false",status="200"} 1`,
		`chargeonce_operation_attempts_total{kind="cancel",replayed="false",status="200"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics has no line %s\n%s", want, grepLines(body, "attempts_total"))
		}
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// The README's table of commands names every command `chargeonce help`
// lists: admin-key was missing from it.
func TestReadmeTableNamesEveryCommand(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(readme), "| command | does |")
	if !ok {
		t.Fatal("README.md has no table of commands (| command | does |)")
	}
	table, _, _ = strings.Cut(table, "\n\n")
	for _, c := range commands() {
		if !strings.Contains(table, "`"+c.name+"`") {
			t.Errorf("README.md's table of commands does not name %s (%s)", c.name, c.summary)
		}
	}
}
