package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/chargeonce/chargeonce/admin"
	"github.com/chargeonce/chargeonce/httpapi"
	"github.com/chargeonce/chargeonce/internal/httpserve"
)

// adminMaxConns caps the connections of --admin-addr: operators, not
// clients.
const adminMaxConns = 256

// adminKeys reads --admin-keys-file, or gives the demo admin key on a
// loopback --admin-addr. An admin key that is also a merchant's API key is
// refused: the two never cross.
func (c *serveConfig) adminKeys(merchants *httpapi.Keys, log *slog.Logger) (*admin.Keys, error) {
	var keys *admin.Keys
	if c.adminKeysFile != "" {
		b, err := os.ReadFile(c.adminKeysFile)
		if err != nil {
			return nil, fmt.Errorf("--admin-keys-file: %w", err)
		}
		if keys, err = admin.ParseKeys(string(b)); err != nil {
			return nil, fmt.Errorf("--admin-keys-file %s: %w", c.adminKeysFile, err)
		}
	} else {
		if !isLoopback(c.adminAddr) {
			return nil, fmt.Errorf("--admin-keys-file is required when --admin-addr (%s) is not a loopback address: the demo admin key is public", c.adminAddr)
		}
		log.Warn("no --admin-keys-file: the admin console runs with the demo admin \"operator\" and key ak_test_demo (loopback only: it answers requests to localhost, 127.0.0.1 and [::1])")
		keys = admin.LoopbackDemoKeys()
	}
	for _, d := range keys.Digests() {
		if merchants.HasDigest(d) {
			return nil, fmt.Errorf("--admin-keys-file: an admin key is also a merchant's API key; admin and merchant keys must differ")
		}
	}
	if weak := keys.Weak(); c.adminKeysFile != "" && len(weak) > 0 {
		return nil, fmt.Errorf("--admin-keys-file %s: the admin key of %s has less than %d bits of entropy and could be guessed; make one with `chargeonce admin-key new --name NAME`",
			c.adminKeysFile, strings.Join(weak, ", "), admin.MinKeyBits)
	}
	return keys, nil
}

// adminTLS loads --admin-tls-cert and --admin-tls-key, or returns nil when
// neither is given.
func (c *serveConfig) adminTLS() (*tls.Config, error) {
	if c.adminTLSCert == "" && c.adminTLSKey == "" {
		return nil, nil
	}
	if c.adminTLSCert == "" || c.adminTLSKey == "" {
		return nil, errors.New("--admin-tls-cert and --admin-tls-key go together: give both, or neither")
	}
	cert, err := tls.LoadX509KeyPair(c.adminTLSCert, c.adminTLSKey)
	if err != nil {
		return nil, fmt.Errorf("--admin-tls-cert/--admin-tls-key: %w", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// adminPlainHTTP refuses a non-loopback --admin-addr without TLS, where
// admin keys and session cookies would cross the network in clear, unless
// --admin-allow-plain-http says something else protects them (a proxy
// that terminates TLS, a network of one's own); then it warns.
func (c *serveConfig) adminPlainHTTP(hasTLS bool, log *slog.Logger) error {
	if hasTLS || isLoopback(c.adminAddr) {
		return nil
	}
	if !c.adminAllowPlainHTTP {
		return fmt.Errorf("--admin-addr %s is not a loopback address: serve it over HTTPS with --admin-tls-cert and --admin-tls-key, "+
			"or, behind a proxy that terminates TLS (--admin-trusted-proxies) or on a network you trust, give --admin-allow-plain-http", c.adminAddr)
	}
	log.Warn("--admin-allow-plain-http: the admin listener speaks plain HTTP on a non-loopback address; admin keys and session cookies cross the network in clear unless a proxy terminates TLS in front of it",
		"admin_addr", c.adminAddr)
	return nil
}

// trustedProxies parses --admin-trusted-proxies: addresses (a /32 or /128)
// and networks.
func (c *serveConfig) trustedProxies() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(c.adminTrustedProxies, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if p, err := netip.ParsePrefix(f); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil {
			return nil, fmt.Errorf("--admin-trusted-proxies: %q is neither an address nor a network (10.0.0.5, 10.0.0.0/8, fd00::/8)", f)
		}
		a = a.Unmap()
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

// serveAdmin serves the operators' API and console on --admin-addr and
// returns the function that closes it.
func (c *serveConfig) serveAdmin(ctx context.Context, rt *runtime, merchants *httpapi.Keys, log *slog.Logger) (closeFn func(), err error) {
	keys, err := c.adminKeys(merchants, log)
	if err != nil {
		return nil, err
	}
	tlsConfig, err := c.adminTLS()
	if err != nil {
		return nil, err
	}
	if err := c.adminPlainHTTP(tlsConfig != nil, log); err != nil {
		return nil, err
	}
	proxies, err := c.trustedProxies()
	if err != nil {
		return nil, err
	}
	h, err := admin.New(admin.Config{
		Store: rt.operators(), Acquirer: rt.acquirer, Finality: rt.finality, Keys: keys, Logger: log,
		Lease: c.lease, AcquirerTimeout: c.acq.timeout, KeyTTL: c.keyTTL, TrustedProxies: proxies,
	})
	if err != nil {
		return nil, err
	}
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", c.adminAddr)
	if err != nil {
		return nil, fmt.Errorf("--admin-addr: %w", err)
	}
	// A reserve of connections serves signed-in operators and the sign-in
	// page only: nobody without an admin key can fill it.
	srv := httpserve.New(httpserve.Config{Name: "admin", Handler: h, Logger: log, MaxConns: adminMaxConns,
		WriteTimeout: c.acq.timeout + handlerSlack, Reserved: h.Reserved, TLS: tlsConfig})
	rt.metrics.Connections("admin", srv.Stats)
	go func() { _ = srv.Serve(ln) }()
	log.Info("admin listening", "addr", ln.Addr().String(), "tls", tlsConfig != nil, "trusted_proxies", len(proxies))
	return func() { _ = srv.Close() }, nil
}

// runAdminKey is `chargeonce admin-key new --name NAME`: it prints a new
// admin key of 256 random bits, for the admin, and its digest line, for
// --admin-keys-file. The key is kept nowhere.
func runAdminKey(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("admin-key", stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: chargeonce admin-key new --name NAME\n\n")
		printFlags(stderr, fs)
	}
	var name string
	fs.StringVar(&name, "name", "", "the admin's name, as the audit trail shows it (letters, digits and . _ - @)")
	switch {
	case len(args) > 0 && args[0] == "new":
		args = args[1:]
	case len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help"):
		// -h before the sub-command: the usage, with new's flags.
	default:
		fs.Usage()
		return usageError("admin-key: the only sub-command is new")
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if name == "" {
		return usageError("admin-key new: --name is required")
	}
	key, line, err := admin.NewKey(name)
	if err != nil {
		return fmt.Errorf("--name: %w", err)
	}
	fmt.Fprintf(stdout, "# The admin key of %s (256 random bits). Give it to %s; it is kept nowhere else:\n%s\n", name, name, key)
	fmt.Fprintf(stdout, "# Its line for --admin-keys-file (the digest only):\n%s\n", line)
	return nil
}
