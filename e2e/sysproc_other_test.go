//go:build !linux

package e2e

import (
	"os/exec"
	"syscall"
	"testing"
)

// sysProcAttr is nil where there is no parent-death signal: t.Cleanup still
// kills every child, but an aborted run may leave some behind.
func sysProcAttr() *syscall.SysProcAttr { return nil }

// limitedCommand fails t: descriptor limits are set with Linux's prlimit.
func limitedCommand(t *testing.T, files int, name string, args ...string) *exec.Cmd {
	t.Helper()
	t.Fatalf("limiting a process to %d descriptors is only done on Linux", files)
	return nil
}
