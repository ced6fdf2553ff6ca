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
	// settled is the deliveries received when the last slice's were all
	// in: every settlement has one, so what a slice adds is its
	// settlements.
	settled int64
	// cells sums the measured slices per workload and concurrency.
	cells map[cellKey]*webhookCell
}

type cellKey struct {
	workload string
	clients  int
}

// webhookCell is what the measured slices of one workload and concurrency
// settled and delivered while their load ran, and what was left.
type webhookCell struct {
	load        time.Duration // the slices' load, drains left out
	settled     int64         // settlements (each one delivery)
	delivered   int64         // deliveries received while the load ran
	lastBacklog int           // pending when the last slice's load ended
	maxBacklog  int
}

// webhookStatser is the stores' count of pending deliveries.
type webhookStatser interface {
	WebhookStats(ctx context.Context) (chargeonce.WebhookStats, error)
}

// drainTimeout bounds the wait for one slice's deliveries.
const drainTimeout = time.Minute

// drainWebhooks waits until no delivery is pending, so that the webhooks
// way's deliveries run in its own measured time rather than under the next
// way's load. A measured slice's settlements and the deliveries received
// while its load ran (for load) are added to its cell.
func (b *bench) drainWebhooks(ctx context.Context, workload string, clients int, load time.Duration, measured bool) error {
	st, ok := b.parent.store.(webhookStatser)
	if !ok {
		return fmt.Errorf("the %s way needs a store that counts its webhook deliveries", wayWebhooks)
	}
	r := b.webhooks
	atLoadEnd := r.delivered.Load()
	start := time.Now()
	for first := true; ; first = false {
		s, err := st.WebhookStats(ctx)
		if err != nil {
			return fmt.Errorf("counting the webhook deliveries: %w", err)
		}
		if first {
			r.backlog = max(r.backlog, s.Pending)
			if measured {
				c := r.cell(workload, clients)
				c.lastBacklog, c.maxBacklog = s.Pending, max(c.maxBacklog, s.Pending)
			}
		}
		if s.Pending == 0 {
			r.drain = max(r.drain, time.Since(start))
			// Every delivery was received before its attempt was
			// recorded: the count is final.
			final := r.delivered.Load()
			if measured {
				c := r.cell(workload, clients)
				c.load += load
				c.settled += final - r.settled
				c.delivered += atLoadEnd - r.settled
			}
			r.settled = final
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

func (r *webhookReceiver) cell(workload string, clients int) *webhookCell {
	k := cellKey{workload, clients}
	c := r.cells[k]
	if c == nil {
		c = &webhookCell{}
		r.cells[k] = c
	}
	return c
}

// setupWebhooks starts the chargeonce+webhooks way: its own serve child for
// webhooksMerchant, and an endpoint of that merchant at a receiver here.
func (b *bench) setupWebhooks(ctx context.Context, db string) error {
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("the webhook receiver: %w", err)
	}
	r := &webhookReceiver{cells: map[cellKey]*webhookCell{}}
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
// no endpoint, per workload and concurrency, and whether one merchant's
// deliveries kept up with its settlements while the load ran.
func (b *bench) reportWebhooks(w io.Writer) {
	if b.webhooks == nil {
		return
	}
	fmt.Fprintf(w, "\nwebhooks (a merchant with an endpoint on loopback; %d deliveries received, every one answered 204;\n  each slice of the way waits for its deliveries and counts that time: up to %d pending at a slice's end, drained in up to %s):\n",
		b.webhooks.delivered.Load(), b.webhooks.backlog, fmtDur(b.webhooks.drain))
	for _, c := range b.cfg.Concurrency {
		for _, wl := range []string{WorkloadNew, WorkloadContended} {
			co, wh := b.find(wl, c, wayChargeonce), b.find(wl, c, wayWebhooks)
			if co == nil || wh == nil || co.rps() == 0 {
				continue
			}
			fmt.Fprintf(w, "  %s at %d clients: %.0f req/s (p99 %s) against %.0f req/s (p99 %s) without an endpoint: %.2f\n",
				wl, c, wh.rps(), fmtDur(wh.percentile(99)), co.rps(), fmtDur(co.percentile(99)), wh.rps()/co.rps())
			if cell := b.webhooks.cells[cellKey{wl, c}]; cell != nil && cell.load > 0 {
				secs := cell.load.Seconds()
				fmt.Fprintf(w, "    while the load ran: %.0f settlements/s, %.0f deliveries/s (%.2f); pending when the load stopped: %d (last slice), %d at most\n",
					float64(cell.settled)/secs, float64(cell.delivered)/secs, float64(cell.delivered)/max(float64(cell.settled), 1),
					cell.lastBacklog, cell.maxBacklog)
			}
		}
	}
}
