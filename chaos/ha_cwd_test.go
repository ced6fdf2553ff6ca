package chaos

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// A process the HA tests start as another user (Patroni, pg_ctl as
// "postgres" when the tests run as root) starts in a directory that user can
// enter, not in the test's: a clone in a private directory (mode 700, as
// `mktemp -d` or a home directory makes) left Patroni's multiprocessing
// child failing to chdir back into its working directory
// (PermissionError), and the cluster never bootstrapped. The shell below
// does what that child does: asks for its working directory, then enters
// it. Not parallel: it changes the test's working directory.
func TestHAProcessesStartWhereTheirUserCanEnter(t *testing.T) {
	owner := pgCredential(t)
	private := t.TempDir()
	if err := os.Chmod(private, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Chdir(private)

	dir, err := os.MkdirTemp(haTempDir(), "chargeonce-ha-cwd-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	node := filepath.Join(dir, "pg1")
	if err := os.Mkdir(node, 0o700); err != nil {
		t.Fatal(err)
	}
	if owner != nil {
		if err := os.Chown(node, int(owner.Uid), int(owner.Gid)); err != nil {
			t.Fatal(err)
		}
	}

	p := &haProc{name: "pg1/patroni", dir: node, cred: owner, log: filepath.Join(dir, "cwd.log"), env: os.Environ(),
		args: []string{"/bin/sh", "-c", `cd "$(/bin/pwd)" && echo "entered $(/bin/pwd)"`}}
	if err := p.start(); err != nil {
		t.Fatal(err)
	}
	<-p.done
	raw, _ := os.ReadFile(p.log)
	if code := p.cmd.ProcessState.ExitCode(); code != 0 || !strings.Contains(string(raw), "entered "+node) {
		t.Fatalf("a process started as %s (the tests' working directory %s, mode 700) could not enter its working directory (exit %d):\n%s",
			userOf(owner), private, code, raw)
	}

	// pg_ctl runs as the same user from the node's directory: with no
	// server it says so, and never that it cannot find its directory.
	out, _ := pgCtlStop(owner, filepath.Join(node, "data"))
	if strings.Contains(out, "directory to") || strings.Contains(out, "Permission denied") {
		t.Fatalf("pg_ctl as %s from the node's directory:\n%s", userOf(owner), out)
	}
}

func userOf(cred *syscall.Credential) string {
	if cred == nil {
		return "the current user"
	}
	return "uid " + strconv.Itoa(int(cred.Uid))
}
