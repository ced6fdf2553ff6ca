package webhook

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"syscall"
)

// ErrForbiddenAddress is matched (errors.Is) by the error of a delivery
// whose endpoint resolved to an address it may not reach.
var ErrForbiddenAddress = errors.New("webhook endpoint address is not allowed")

// metadataAddr is the cloud metadata service (AWS, GCP, Azure, …); it is
// link-local too, but named here because it is the prize of a forgery.
var metadataAddr = netip.MustParseAddr("169.254.169.254")

// CheckAddr reports why a delivery may not connect to ip: it is loopback,
// private, link-local, multicast, unspecified or the metadata address.
// Any address is allowed when allowPrivate is true.
func CheckAddr(ip netip.Addr, allowPrivate bool) error {
	if allowPrivate {
		return nil
	}
	ip = ip.Unmap()
	var class string
	switch {
	case ip == metadataAddr:
		class = "the cloud metadata address"
	case ip.IsLoopback():
		class = "loopback"
	case ip.IsPrivate():
		class = "private"
	case ip.IsMulticast():
		class = "multicast"
	case ip.IsLinkLocalUnicast():
		class = "link-local"
	case ip.IsUnspecified():
		class = "unspecified"
	case !ip.IsValid():
		class = "invalid"
	default:
		return nil
	}
	return fmt.Errorf("%w: %s is %s (--webhooks-allow-private allows it)", ErrForbiddenAddress, ip, class)
}

// control is the dialer's Control: it runs after DNS, on the address the
// socket is about to connect to, so a name that resolves to a forbidden
// address (or is re-bound to one after a check) is refused all the same.
func control(allowPrivate bool) func(network, address string, c syscall.RawConn) error {
	return func(_, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return fmt.Errorf("%w: cannot parse %q", ErrForbiddenAddress, address)
		}
		return CheckAddr(ap.Addr(), allowPrivate)
	}
}

// CheckURL reports what is wrong with an endpoint URL: not absolute, not
// https (http too when allowPrivate), user info, or a literal address that
// CheckAddr refuses. Names are checked again, resolved, at every dial.
func CheckURL(raw string, allowPrivate bool) error {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || !u.IsAbs() {
		return errors.New("url must be an absolute https URL")
	}
	switch {
	case u.Scheme == "https":
	case u.Scheme == "http" && allowPrivate:
	default:
		return errors.New("url must use https")
	}
	if u.User != nil {
		return errors.New("url must not carry a user name or password")
	}
	if len(raw) > 2048 {
		return errors.New("url must be at most 2048 characters")
	}
	if ip, err := netip.ParseAddr(u.Hostname()); err == nil {
		if err := CheckAddr(ip, allowPrivate); err != nil {
			return err
		}
	}
	return nil
}

// Dialer returns the dialer deliveries connect with.
func Dialer(allowPrivate bool) *net.Dialer {
	return &net.Dialer{Timeout: DeliveryTimeout, Control: control(allowPrivate)}
}
