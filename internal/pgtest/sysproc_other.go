//go:build !linux

package pgtest

import (
	"os"
	"syscall"
)

// sysProcAttr runs a PostgreSQL program as the current user. Only Linux gets
// the switch to another user and the parent-death signal; elsewhere, run the
// tests as an ordinary user or set TEST_DATABASE_URL.
func sysProcAttr(own *owner) *syscall.SysProcAttr {
	return nil
}

// quitSignal stops a server where SIGQUIT does not exist: killed outright.
var quitSignal = os.Kill
