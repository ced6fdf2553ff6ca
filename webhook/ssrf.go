package webhook

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"syscall"
)

// ErrForbiddenAddress is matched (errors.Is) by the error of a delivery
// whose endpoint resolved to an address it may not reach.
var ErrForbiddenAddress = errors.New("webhook endpoint address is not allowed")

// metadataAddrs are cloud metadata services: they are in a forbidden range
// too (but Azure's), and are named because they are the prize of a
// forgery.
var metadataAddrs = map[netip.Addr]bool{
	netip.MustParseAddr("169.254.169.254"): true, // AWS, GCP, Azure IMDS, OpenStack, Oracle, DigitalOcean
	netip.MustParseAddr("169.254.170.2"):   true, // AWS ECS task metadata
	netip.MustParseAddr("100.100.100.200"): true, // Alibaba Cloud
	netip.MustParseAddr("168.63.129.16"):   true, // Azure WireServer: a public address
	netip.MustParseAddr("192.0.0.192"):     true, // Oracle Cloud
	netip.MustParseAddr("fd00:ec2::254"):   true, // AWS IMDS over IPv6
}

// special is one range a delivery may not reach.
type special struct {
	prefix netip.Prefix
	class  string
}

func specials(class string, prefixes ...string) []special {
	out := make([]special, len(prefixes))
	for i, p := range prefixes {
		out[i] = special{netip.MustParsePrefix(p), class}
	}
	return out
}

// forbidden4 and forbidden6 are every entry of the IANA IPv4 and IPv6
// Special-Purpose Address Registries (iana-ipv4-special-registry and
// iana-ipv6-special-registry, as of 2025), globally reachable or not, plus
// the multicast ranges, 240.0.0.0/4, IPv4-compatible ::/96 and site-local
// fec0::/10. The ranges that embed an IPv4 address (IPv4-mapped, NAT64
// 64:ff9b::/96, 6to4 2002::/16, Teredo 2001::/32) are not here: CheckAddr
// checks the embedded address against forbidden4 instead. The first match
// names the class, so narrower ranges come first.
var (
	forbidden4 = slices.Concat(
		specials("loopback", "127.0.0.0/8"),
		specials("private", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"),
		specials("link-local", "169.254.0.0/16"),
		specials("unspecified", "0.0.0.0/8"), // "this network"
		specials("shared address space (carrier-grade NAT)", "100.64.0.0/10"),
		specials("IETF protocol assignments", "192.0.0.0/24"),
		specials("documentation", "192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24"),
		specials("benchmarking", "198.18.0.0/15"),
		specials("AS112", "192.31.196.0/24", "192.175.48.0/24"),
		specials("AMT", "192.52.193.0/24"),
		specials("6to4 relay anycast", "192.88.99.0/24"),
		specials("multicast", "224.0.0.0/4"),
		specials("broadcast", "255.255.255.255/32"),
		specials("reserved", "240.0.0.0/4"),
	)
	forbidden6 = slices.Concat(
		specials("unspecified", "::/128"),
		specials("loopback", "::1/128"),
		specials("IPv4-compatible (deprecated)", "::/96"),
		specials("IPv4-translated (SIIT)", "::ffff:0:0:0/96"),
		specials("local-use IPv4/IPv6 translation", "64:ff9b:1::/48"),
		specials("discard-only", "100::/64"),
		specials("dummy prefix", "100:0:0:1::/64"),
		specials("IETF protocol assignments", "2001::/23"), // Teredo, 2001::/32, is checked by its embedded addresses
		specials("documentation", "2001:db8::/32", "3fff::/20"),
		specials("AS112", "2620:4f:8000::/48"),
		specials("segment routing (SRv6) SIDs", "5f00::/16"),
		specials("private", "fc00::/7"), // unique-local
		specials("link-local", "fe80::/10"),
		specials("site-local (deprecated)", "fec0::/10"),
		specials("multicast", "ff00::/8"),
	)
	nat64  = netip.MustParsePrefix("64:ff9b::/96")
	sixto4 = netip.MustParsePrefix("2002::/16")
	teredo = netip.MustParsePrefix("2001::/32")
)

// Embedded returns the IPv4 addresses an IPv6 address carries, and how:
// IPv4-mapped (::ffff:a.b.c.d), NAT64 (64:ff9b::a.b.c.d), 6to4
// (2002:AABB:CCDD::), Teredo (2001:0:server:…:client, the client's
// address inverted). A delivery to one of them reaches that IPv4 address
// (through a translator or relay), so it is checked as that address.
func Embedded(ip netip.Addr) (via string, v4 []netip.Addr) {
	if !ip.Is6() {
		return "", nil
	}
	b := ip.As16()
	switch {
	case ip.Is4In6():
		return "IPv4-mapped", []netip.Addr{ip.Unmap()}
	case nat64.Contains(ip):
		return "NAT64", []netip.Addr{netip.AddrFrom4([4]byte(b[12:16]))}
	case sixto4.Contains(ip):
		return "6to4", []netip.Addr{netip.AddrFrom4([4]byte(b[2:6]))}
	case teredo.Contains(ip):
		client := [4]byte{^b[12], ^b[13], ^b[14], ^b[15]}
		return "Teredo", []netip.Addr{netip.AddrFrom4([4]byte(b[4:8])), netip.AddrFrom4(client)}
	}
	return "", nil
}

// classify names the forbidden class of ip, "" when a delivery may reach it.
func classify(ip netip.Addr) string {
	if !ip.IsValid() {
		return "invalid"
	}
	ip = ip.WithZone("")
	if metadataAddrs[ip] || metadataAddrs[ip.Unmap()] {
		return "the cloud metadata address"
	}
	if via, v4 := Embedded(ip); via != "" {
		for _, a := range v4 {
			if c := classify(a); c != "" {
				return c + " (the IPv4 address in this " + via + " address)"
			}
		}
		return ""
	}
	table := forbidden6
	if ip.Is4() {
		table = forbidden4
	}
	for _, sp := range table {
		if sp.prefix.Contains(ip) {
			return sp.class
		}
	}
	return ""
}

// CheckAddr reports why a delivery may not connect to ip: it is in a range
// of the IANA special-purpose registries (loopback, private, link-local,
// shared, documentation, benchmarking, reserved, …), multicast, a cloud
// metadata address, or an IPv6 address that embeds one of those IPv4
// addresses (IPv4-mapped, NAT64, 6to4, Teredo). Any address is allowed
// when allowPrivate is true.
func CheckAddr(ip netip.Addr, allowPrivate bool) error {
	if allowPrivate {
		return nil
	}
	class := classify(ip)
	if class == "" {
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
