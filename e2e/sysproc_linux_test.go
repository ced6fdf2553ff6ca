package e2e

import (
	"fmt"
	"os/exec"
	"syscall"
	"testing"
)

// sysProcAttr makes the kernel kill a child process should the test binary
// die without cleaning up (a timeout panic, a kill), so an aborted run leaves
// no chargeonce process behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// limitedCommand runs name with its descriptor limit (RLIMIT_NOFILE) set to
// files, through util-linux's prlimit, which sets it and execs name in the
// same process.
func limitedCommand(t *testing.T, files int, name string, args ...string) *exec.Cmd {
	t.Helper()
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		t.Fatalf("limiting a process's descriptors needs prlimit (util-linux): %v", err)
	}
	return exec.Command(prlimit, append([]string{fmt.Sprintf("--nofile=%d:%d", files, files), "--", name}, args...)...)
}
