package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"time"
)

// webhookReceiver is the webhooks way's endpoint: a loopback server in the
// load generator that answers every delivery 204 and counts them.
type webhookReceiver struct {
	srv       *http.Server
	delivered atomic.Int64
}

// setupWebhooks starts the chargeonce+webhooks way: its own serve child for
// webhooksMerchant, and an endpoint of that merchant at a receiver here.
func (b *bench) setupWebhooks(ctx context.Context, db string) error {
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("the webhook receiver: %w", err)
	}
	r := &webhookReceiver{}
	r.srv = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		_, _ = io.Copy(io.Discard, req.Body)
		r.delivered.Add(1)
		w.WriteHeader(http.StatusNoContent)
	})}
	go r.srv.Serve(ln) //nolint:errcheck // ends with Close
	b.webhooks = r
	wh, err := b.spawn(ctx, wayWebhooks, kindChargeonce, db)
	if err != nil {
		return err
	}
	body := fmt.Appendf(nil, `{"url":"http://%s/hooks","description":"chargeonce bench"}`, ln.Addr())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+wh.addr+"/v1/webhook_endpoints", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+b.secret)
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return fmt.Errorf("creating the webhook endpoint: %w", err)
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("creating the webhook endpoint: %d %s", resp.StatusCode, msg)
	}
	b.ways = append(b.ways, &way{name: wayWebhooks, server: wh, checksFlag: true, noReplay: true,
		newClient: func() client { return newHTTPClient(wh.addr, b.secret) }})
	return nil
}

func (r *webhookReceiver) close() {
	if r != nil {
		_ = r.srv.Close()
	}
}

// reportWebhooks prints what the webhooks way cost against chargeonce with
// no endpoint, per workload at the ratio concurrency.
func (b *bench) reportWebhooks(w io.Writer) {
	if b.webhooks == nil {
		return
	}
	rc := b.ratioClients()
	fmt.Fprintf(w, "\nwebhooks (a merchant with an endpoint on loopback; %d deliveries received, every one answered 204):\n", b.webhooks.delivered.Load())
	for _, wl := range []string{WorkloadNew, WorkloadContended} {
		co, wh := b.find(wl, rc, wayChargeonce), b.find(wl, rc, wayWebhooks)
		if co == nil || wh == nil || co.rps() == 0 {
			continue
		}
		fmt.Fprintf(w, "  %s at %d clients: %.0f req/s (p99 %s) against %.0f req/s (p99 %s) without an endpoint: %.2f\n",
			wl, rc, wh.rps(), fmtDur(wh.percentile(99)), co.rps(), fmtDur(co.percentile(99)), wh.rps()/co.rps())
	}
}
