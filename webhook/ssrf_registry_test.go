package webhook_test

import (
	"encoding/csv"
	"errors"
	"math/big"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/chargeonce/chargeonce/webhook"
)

// The IANA special-purpose address registries, as published in CSV
// (https://www.iana.org/assignments/iana-ipv4-special-registry/ and
// iana-ipv6-special-registry/), kept in testdata: the test reads its table
// from them, so a range the guard's own table missed fails here.
const (
	registry4 = "testdata/iana-ipv4-special-registry-1.csv"
	registry6 = "testdata/iana-ipv6-special-registry-1.csv"
)

// registryBlocks reads the address blocks of a registry CSV, footnote
// marks ("192.0.0.0/24 [2]") dropped and shared rows
// ("192.0.0.170/32, 192.0.0.171/32") split.
func registryBlocks(t *testing.T, path string) map[netip.Prefix]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil || len(rows) < 2 || rows[0][0] != "Address Block" {
		t.Fatalf("%s: %d rows, %v", path, len(rows), err)
	}
	out := map[netip.Prefix]string{}
	for _, row := range rows[1:] {
		for _, b := range strings.Split(row[0], ",") {
			b, _, _ = strings.Cut(strings.TrimSpace(b), " ")
			p, err := netip.ParsePrefix(b)
			if err != nil {
				t.Fatalf("%s: block %q: %v", path, row[0], err)
			}
			out[p] = row[1]
		}
	}
	return out
}

// addrAt returns the address at fraction num/den of p's range.
func addrAt(p netip.Prefix, num, den int64) netip.Addr {
	bits := p.Addr().BitLen()
	first := new(big.Int).SetBytes(p.Masked().Addr().AsSlice())
	size := new(big.Int).Lsh(big.NewInt(1), uint(bits-p.Bits()))
	off := new(big.Int).Div(new(big.Int).Mul(new(big.Int).Sub(size, big.NewInt(1)), big.NewInt(num)), big.NewInt(den))
	b := new(big.Int).Add(first, off).FillBytes(make([]byte, bits/8))
	a, _ := netip.AddrFromSlice(b)
	return a
}

// embedders build, for an IPv4 address, the IPv6 addresses that reach it
// (SPEC: embedded v4 in NAT64, 6to4 and Teredo is checked as v4).
var embedders = map[string]func(v4 netip.Addr) netip.Addr{
	"IPv4-mapped": func(v4 netip.Addr) netip.Addr { return netip.AddrFrom16(v4.As16()) },
	"NAT64": func(v4 netip.Addr) netip.Addr {
		b := netip.MustParseAddr("64:ff9b::").As16()
		copy(b[12:], v4.AsSlice())
		return netip.AddrFrom16(b)
	},
	"6to4": func(v4 netip.Addr) netip.Addr {
		b := netip.MustParseAddr("2002::1").As16()
		copy(b[2:6], v4.AsSlice())
		return netip.AddrFrom16(b)
	},
	"Teredo server": func(v4 netip.Addr) netip.Addr {
		b := netip.MustParseAddr("2001:0:0:0:8000:f227:f7f7:f7f7").As16() // client 8.8.8.8
		copy(b[4:8], v4.AsSlice())
		return netip.AddrFrom16(b)
	},
	"Teredo client": func(v4 netip.Addr) netip.Addr {
		b := netip.MustParseAddr("2001:0:808:808:8000:f227::").As16() // server 8.8.8.8
		for i, x := range v4.AsSlice() {
			b[12+i] = ^x
		}
		return netip.AddrFrom16(b)
	},
}

// embedding are the registry's blocks whose addresses are checked by the
// IPv4 address they carry rather than refused whole.
var embedding = map[string]bool{"::ffff:0:0/96": true, "64:ff9b::/96": true, "2002::/16": true, "2001::/32": true}

// TestCheckAddrFollowsIANARegistries refuses the first, a middle and the
// last address of every block of both registries (and of multicast,
// IPv4-compatible ::/96 and site-local fec0::/10, which the issue names),
// and every IPv6 address that embeds one of those IPv4 addresses in the
// IPv4-mapped, NAT64, 6to4 or Teredo forms; public addresses, and their
// embedded forms, pass. Seen allowed before: 100.100.100.200, 0.0.0.0/8,
// 192.0.0.0/24, 198.18.0.0/15, 240.0.0.0/4, 64:ff9b::a9fe:a9fe, 6to4 of a
// private address, ::/96, fec0::/10.
func TestCheckAddrFollowsIANARegistries(t *testing.T) {
	t.Parallel()
	v4, v6 := registryBlocks(t, registry4), registryBlocks(t, registry6)
	if len(v4) < 25 || len(v6) < 25 {
		t.Fatalf("the registries hold %d and %d blocks; the files are truncated", len(v4), len(v6))
	}
	v4[netip.MustParsePrefix("224.0.0.0/4")] = "multicast"
	v6[netip.MustParsePrefix("ff00::/8")] = "multicast"
	v6[netip.MustParsePrefix("::/96")] = "IPv4-compatible (deprecated)"
	v6[netip.MustParsePrefix("fec0::/10")] = "site-local (deprecated)"

	refused := func(a netip.Addr, why string) {
		t.Helper()
		err := webhook.CheckAddr(a, false)
		if !errors.Is(err, webhook.ErrForbiddenAddress) {
			t.Errorf("%s (%s) allowed: %v", a, why, err)
		}
		if webhook.CheckAddr(a, true) != nil {
			t.Errorf("%s refused with allowPrivate", a)
		}
	}
	for p, name := range v4 {
		for _, a := range []netip.Addr{addrAt(p, 0, 1), addrAt(p, 1, 2), addrAt(p, 1, 1)} {
			refused(a, p.String()+" "+name)
			for how, embed := range embedders {
				refused(embed(a), how+" of "+a.String()+", in "+p.String()+" "+name)
			}
		}
	}
	for p, name := range v6 {
		if embedding[p.String()] {
			continue // checked through the IPv4 address embedded, above
		}
		for _, a := range []netip.Addr{addrAt(p, 0, 1), addrAt(p, 1, 2), addrAt(p, 1, 1)} {
			refused(a, p.String()+" "+name)
		}
	}
	for _, s := range []string{"8.8.8.8", "1.1.1.1", "93.184.216.34", "172.32.0.1", "100.128.0.1", "198.20.0.1", "223.255.255.254"} {
		a := netip.MustParseAddr(s)
		if err := webhook.CheckAddr(a, false); err != nil {
			t.Errorf("public %s refused: %v", a, err)
		}
		for how, embed := range embedders {
			if err := webhook.CheckAddr(embed(a), false); err != nil {
				t.Errorf("%s of public %s (%s) refused: %v", how, a, embed(a), err)
			}
		}
	}
	for _, s := range []string{"2606:4700:4700::1111", "2a00:1450:4001::200e", "2001:4860:4860::8888"} {
		if err := webhook.CheckAddr(netip.MustParseAddr(s), false); err != nil {
			t.Errorf("public %s refused: %v", s, err)
		}
	}
	// The addresses of the issue, by name.
	for _, s := range []string{"100.100.100.200", "0.1.2.3", "192.0.0.192", "198.19.255.255", "250.1.2.3",
		"64:ff9b::a9fe:a9fe", "2002:a9fe:a9fe::1", "2002:c0a8:101::1", "::7f00:1", "::a9fe:a9fe", "fec0::1", "fd00:ec2::254", "168.63.129.16"} {
		refused(netip.MustParseAddr(s), "named by the issue")
	}
}
