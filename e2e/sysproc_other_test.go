//go:build !linux

package e2e

import "syscall"

// sysProcAttr is nil where there is no parent-death signal: t.Cleanup still
// kills every child, but an aborted run may leave some behind.
func sysProcAttr() *syscall.SysProcAttr { return nil }
