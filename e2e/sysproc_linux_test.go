package e2e

import "syscall"

// sysProcAttr makes the kernel kill a child process should the test binary
// die without cleaning up (a timeout panic, a kill), so an aborted run leaves
// no chargeonce process behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
