package httpserve

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// unread reports whether c's socket holds bytes the server has not read
// yet: a request that has arrived on a connection net/http has not got
// to. Such a connection is not idle, whatever its state says.
func unread(c net.Conn) bool {
	if r, ok := c.(*reservedConn); ok {
		c = r.Conn
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	n := 0
	_ = raw.Control(func(fd uintptr) {
		n, _ = unix.IoctlGetInt(int(fd), unix.TIOCINQ) //nolint:gosec // G115: a descriptor fits an int
	})
	return n > 0
}
