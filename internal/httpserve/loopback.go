package httpserve

import (
	"net"
	"net/netip"
	"strings"
)

// LoopbackHost reports whether host, a request's Host (a name or an
// address, with or without a port), names this machine's loopback:
// localhost, or a loopback address (127.0.0.1, [::1]). A public key, such
// as the demo keys serve runs with on loopback, answers only those: any
// other name reaching a loopback listener is a DNS name its owner pointed
// at 127.0.0.1 (DNS rebinding), and the page asking is that owner's.
func LoopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	} else if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1]
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Zone() == "" && ip.Unmap().IsLoopback()
}
