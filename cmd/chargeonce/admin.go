package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"

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
		log.Warn("no --admin-keys-file: the admin console runs with the demo admin \"operator\" and key ak_test_demo (loopback only)")
		var err error
		if keys, err = admin.ParseKeys(admin.DemoKeys); err != nil {
			return nil, err
		}
	}
	for _, d := range keys.Digests() {
		if merchants.HasDigest(d) {
			return nil, fmt.Errorf("--admin-keys-file: an admin key is also a merchant's API key; admin and merchant keys must differ")
		}
	}
	return keys, nil
}

// serveAdmin serves the operators' API and console on --admin-addr and
// returns the function that closes it.
func (c *serveConfig) serveAdmin(ctx context.Context, rt *runtime, merchants *httpapi.Keys, log *slog.Logger) (closeFn func(), err error) {
	keys, err := c.adminKeys(merchants, log)
	if err != nil {
		return nil, err
	}
	h, err := admin.New(admin.Config{
		Store: rt.operators(), Acquirer: rt.acquirer, Keys: keys, Logger: log,
		Lease: c.lease, AcquirerTimeout: c.acq.timeout, KeyTTL: c.keyTTL,
	})
	if err != nil {
		return nil, err
	}
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", c.adminAddr)
	if err != nil {
		return nil, fmt.Errorf("--admin-addr: %w", err)
	}
	srv := httpserve.New(httpserve.Config{Name: "admin", Handler: h, Logger: log, MaxConns: adminMaxConns,
		WriteTimeout: c.acq.timeout + handlerSlack})
	rt.metrics.Connections("admin", srv.Stats)
	go func() { _ = srv.Serve(ln) }()
	log.Info("admin listening", "addr", ln.Addr().String())
	return func() { _ = srv.Close() }, nil
}
