package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"text/tabwriter"
	"time"
)

// The refunds comparison (--refunds): what a refund costs next to a new
// charge, both on chargeonce, with the minimal design's new charge as the
// floor, at the ratio concurrency, interleaved like every other cell.
//
//   - charge: chargeonce's new charge (the new workload) and replay;
//   - refund: POST /v1/charges/{id}/refunds of one cent, each with a fresh
//     key (new) or a key whose refund is stored (replay), spread over
//     refundCharges captured charges, so that refunds of one charge rarely
//     wait on each other's row lock (a refund locks its charge's row);
//   - minimal: the minimal design's new charge.

// refundCharges is how many captured charges the refunds are spread over.
const refundCharges = 256

// refundBody is every refund's body: one cent, so that the captured
// charges never run out of what remains refundable.
var refundBody = []byte(`{"amount_cents":1}`)

// wayRefund is chargeonce serving refunds.
const wayRefund = "refund"

// refundClient sends each request of a workload as a refund of one of the
// captured charges: the key picks the charge, so a replayed key goes to
// the charge it was first sent for, with the same body.
type refundClient struct {
	*httpClient
	charges []string
}

func (c *refundClient) charge(ctx context.Context, key string, _ []byte, _ *chargeRequest) (int, bool, error) {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	id := c.charges[int(h.Sum32()%uint32(len(c.charges)))] //nolint:gosec // G115: len is refundCharges
	return c.post(ctx, "/v1/charges/"+id+"/refunds", "rf-"+key, refundBody)
}

// refundResults are the refunds comparison's measurements.
type refundResults struct {
	clients int
	// new and replay are the cells' results, by way.
	new, replay map[string]*result
}

// measureRefunds runs the refunds comparison on a chargeonce and a minimal
// child of their own (the main ones are stopped by now) on the run's
// database.
func (b *bench) measureRefunds(ctx context.Context) error {
	co, err := b.spawn(ctx, "chargeonce-refunds", kindChargeonce, b.main)
	if err != nil {
		return err
	}
	mn, err := b.spawn(ctx, "minimal-refunds", kindMinimal, b.main)
	if err != nil {
		return err
	}
	defer b.stopChildren()
	start := time.Now()
	charges, err := captureCharges(ctx, co.addr, b.secret, b.runID, refundCharges)
	if err != nil {
		return err
	}
	rc := b.ratioClients()
	saved := b.ways
	defer func() { b.ways = saved }()
	b.ways = []*way{
		{name: wayChargeonce, server: co, checksFlag: true, newClient: func() client { return newHTTPClient(co.addr, b.secret) }},
		{name: wayRefund, server: co, checksFlag: true, newClient: func() client {
			return &refundClient{httpClient: newHTTPClient(co.addr, b.secret), charges: charges}
		}},
		{name: wayMinimal, server: mn, noReplay: true, newClient: func() client { return newHTTPClient(mn.addr, b.secret) }},
	}
	if len(b.replayKeys) > 0 {
		// Every replay key's refund is stored before replays are measured.
		rcl := &refundClient{httpClient: newHTTPClient(co.addr, b.secret), charges: charges}
		for _, k := range b.replayKeys {
			status, _, err := rcl.charge(ctx, k, nil, nil)
			if err == nil && status != http.StatusCreated {
				err = fmt.Errorf("status %d", status)
			}
			if err != nil {
				rcl.close()
				return fmt.Errorf("seeding the refund of replay key %s: %w", k, err)
			}
		}
		rcl.close()
	}
	b.logf("refunds: %d captured charges and %d stored refunds in %s", len(charges), len(b.replayKeys), time.Since(start).Round(time.Millisecond))
	res := &refundResults{clients: rc, new: map[string]*result{}, replay: map[string]*result{}}
	rs, err := b.measureCell(ctx, WorkloadNew, rc, b.cfg.Warmup)
	if err != nil {
		return err
	}
	for _, r := range rs {
		res.new[r.way] = r
		b.logf("refunds: new %-10s %8.0f req/s  p50 %8s  p99 %8s  errors %d", r.way, r.rps(), fmtDur(r.percentile(50)), fmtDur(r.percentile(99)), r.errors)
	}
	if len(b.replayKeys) > 0 {
		rs, err := b.measureCell(ctx, WorkloadReplay, rc, b.cfg.Warmup)
		if err != nil {
			return err
		}
		for _, r := range rs {
			res.replay[r.way] = r
			b.logf("refunds: replay %-10s %8.0f req/s  p50 %8s  p99 %8s  errors %d", r.way, r.rps(), fmtDur(r.percentile(50)), fmtDur(r.percentile(99)), r.errors)
		}
	}
	b.refunds = res
	if b.cfg.ProfileDir != "" {
		// The refund way alone: its profile is refund-new.pprof.
		b.ways = b.ways[1:2]
		if err := b.profile(ctx, WorkloadNew, rc); err != nil {
			return fmt.Errorf("--profile: %w", err)
		}
	}
	return nil
}

// captureCharges charges n times through the chargeonce server at addr and
// returns the captured charges' ids.
func captureCharges(ctx context.Context, addr, secret, runID string, n int) ([]string, error) {
	hc := &http.Client{Timeout: requestTimeout}
	ids := make([]string, 0, n)
	for i := range n {
		body := appendBody(nil, &chargeRequest{OrderID: int64(900_000_000 + i), AmountCents: benchAmount, Currency: benchCurrency, PaymentToken: benchToken})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/charges", bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+secret)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", fmt.Sprintf("rfc-%s-%d", runID, i))
		resp, err := hc.Do(req)
		if err != nil {
			return nil, fmt.Errorf("capturing a charge to refund: %w", err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("capturing a charge to refund: %w", err)
		}
		var ch struct{ ID, Status string }
		if resp.StatusCode != http.StatusCreated || json.Unmarshal(b, &ch) != nil || ch.Status != "captured" {
			return nil, fmt.Errorf("capturing a charge to refund: %d %s", resp.StatusCode, b)
		}
		ids = append(ids, ch.ID)
	}
	return ids, nil
}

// reportRefunds prints the refunds comparison.
func (b *bench) reportRefunds(w io.Writer) {
	r := b.refunds
	if r == nil {
		return
	}
	fmt.Fprintf(w, "\nrefunds at %d clients (one cent each, over %d captured charges) beside new charges, on fresh servers:\n", r.clients, refundCharges)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "workload\tway\treq/s\tp50\tp99\terrors\treq/s vs charge\treq/s vs minimal\t")
	for _, wl := range []struct {
		name string
		rs   map[string]*result
	}{{WorkloadNew, r.new}, {WorkloadReplay, r.replay}} {
		for _, way := range []string{wayChargeonce, wayRefund, wayMinimal} {
			x := wl.rs[way]
			if x == nil {
				continue
			}
			vsCharge, vsMin := "", ""
			if c := wl.rs[wayChargeonce]; way == wayRefund && c != nil && c.rps() > 0 {
				vsCharge = fmtRatio(x.rps() / c.rps())
			}
			if m := r.new[wayMinimal]; way != wayMinimal && wl.name == WorkloadNew && m != nil && m.rps() > 0 {
				vsMin = fmtRatio(x.rps() / m.rps())
			}
			name := way
			if way == wayChargeonce {
				name = "charge"
			}
			fmt.Fprintf(tw, "%s\t%s\t%.0f\t%s\t%s\t%d\t%s\t%s\t\n", wl.name, name, x.rps(), fmtDur(x.percentile(50)), fmtDur(x.percentile(99)), x.errors, vsCharge, vsMin)
		}
	}
	_ = tw.Flush()
}
