//go:build !linux

package httpserve

import "net"

// unread reports false: only Linux's is asked what a socket holds unread,
// elsewhere an idle connection is evicted whether or not a request waits
// on it.
func unread(net.Conn) bool { return false }
