package pgtest

import "syscall"

// sysProcAttr runs a PostgreSQL program as own (nil: the current user). The
// server also gets SIGQUIT, PostgreSQL's immediate shutdown, should the test
// binary die without stopping it (a timeout panic, a kill), so an aborted
// run leaves no server behind.
func sysProcAttr(own *owner) *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Pdeathsig: syscall.SIGQUIT}
	if own != nil {
		a.Credential = &syscall.Credential{Uid: own.uid, Gid: own.gid, Groups: []uint32{}}
	}
	return a
}

// quitSignal asks PostgreSQL for an immediate shutdown.
var quitSignal = syscall.SIGQUIT
