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

	"github.com/chargeonce/chargeonce"
)

// webhookReceiver is the webhooks way's endpoint: a loopback server in the
// load generator that answers every delivery 204 and counts them.
type webhookReceiver struct {
	srv       *http.Server
	delivered atomic.Int64
	// backlog and drain are the most deliveries pending when one of the
	// way's slices ended, and the longest wait for them.
	backlog int
	drain   time.Duration
}

// webhookStatser is the stores' count of pending deliveries.
type webhookStatser interface {
	WebhookStats(ctx context.Context) (chargeonce.WebhookStats, error)
}

// drainTimeout bounds the wait for one slice's deliveries.
const drainTimeout = time.Minute

// drainWebhooks waits until no delivery is pending, so that the webhooks
// way's deliveries run in its own measured time rather than under the next
// way's load.
func (b *bench) drainWebhooks(ctx context.Context) error {
	st, ok := b.parent.store.(webhookStatser)
	if !ok {
		return fmt.Errorf("the %s way needs a store that counts its webhook deliveries", wayWebhooks)
	}
	start := time.Now()
	for first := true; ; first = false {
		s, err := st.WebhookStats(ctx)
		if err != nil {
			return fmt.Errorf("counting the webhook deliveries: %w", err)
		}
		if first {
			b.webhooks.backlog = max(b.webhooks.backlog, s.Pending)
		}
		if s.Pending == 0 {
			b.webhooks.drain = max(b.webhooks.drain, time.Since(start))
			return nil
		}
		if time.Since(start) > drainTimeout {
			return fmt.Errorf("%d webhook deliveries still pending %s after a slice of the %s way", s.Pending, drainTimeout, wayWebhooks)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
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
	fmt.Fprintf(w, "\nwebhooks (a merchant with an endpoint on loopback; %d deliveries received, every one answered 204;\n  each slice of the way waits for its deliveries and counts that time: up to %d pending at a slice's end, drained in up to %s):\n",
		b.webhooks.delivered.Load(), b.webhooks.backlog, fmtDur(b.webhooks.drain))
	for _, wl := range []string{WorkloadNew, WorkloadContended} {
		co, wh := b.find(wl, rc, wayChargeonce), b.find(wl, rc, wayWebhooks)
		if co == nil || wh == nil || co.rps() == 0 {
			continue
		}
		fmt.Fprintf(w, "  %s at %d clients: %.0f req/s (p99 %s) against %.0f req/s (p99 %s) without an endpoint: %.2f\n",
			wl, rc, wh.rps(), fmtDur(wh.percentile(99)), co.rps(), fmtDur(co.percentile(99)), wh.rps()/co.rps())
	}
}
