package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// The operator (SPEC "Finality"): while the nemesis runs, somebody at the
// console resolves every stuck refund as failed, without force, as the
// operator of issue 47 did. A refund whose request the acquirer has not
// seen may still land (tok_slow's refunds land after the attempt's
// timeout; the nemesis holds requests on the acquirer's links): the
// service must fence it or refuse the "no", never settle failed what then
// refunds. The refund checker (refunds_test.go) catches a refund answered
// failed that the acquirer's ledger holds as refunded.

// operatorEvery is how often the operator reads the stuck list.
const operatorEvery = 150 * time.Millisecond

// operatorKey is serve's demo admin key on its loopback --admin-addr.
const operatorKey = "ak_test_demo"

// operator counts its resolutions by answer.
type operator struct {
	mu      sync.Mutex
	answers map[string]int
}

func (o *operator) count(answer string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.answers == nil {
		o.answers = map[string]int{}
	}
	o.answers[answer]++
}

func (o *operator) counts() map[string]int {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[string]int{}
	for k, v := range o.answers {
		out[k] = v
	}
	return out
}

// run resolves stuck refunds as failed until ctx ends.
func (o *operator) run(ctx context.Context, hc *http.Client, adminURL string) {
	t := time.NewTicker(operatorEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, id := range o.stuckRefunds(ctx, hc, adminURL) {
			o.count(o.resolveFailed(ctx, hc, adminURL, id))
		}
	}
}

// stuckRefunds lists the ids of the refunds on the stuck list; nothing
// when the admin API cannot be read (its instance is down, or paused).
func (o *operator) stuckRefunds(ctx context.Context, hc *http.Client, adminURL string) []string {
	status, body := o.call(ctx, hc, "GET", adminURL+"/admin/v1/charges?limit=50", nil)
	if status != http.StatusOK {
		return nil
	}
	var page struct {
		Data []struct {
			Kind   string
			Refund *struct{ ID string }
		}
	}
	if json.Unmarshal(body, &page) != nil {
		return nil
	}
	var ids []string
	for _, row := range page.Data {
		if row.Kind == "refund" && row.Refund != nil {
			ids = append(ids, row.Refund.ID)
		}
	}
	return ids
}

// resolveFailed asks to settle the refund failed, unforced, and says what
// came of it: "200", or the status and problem type of the refusal.
func (o *operator) resolveFailed(ctx context.Context, hc *http.Client, adminURL, id string) string {
	status, body := o.call(ctx, hc, "POST", adminURL+"/admin/v1/refunds/"+id+"/resolve",
		[]byte(`{"status":"failed","reason":"chaos operator: the acquirer never saw it"}`))
	if status == http.StatusOK {
		return "200 settled failed"
	}
	var p struct{ Type string }
	_ = json.Unmarshal(body, &p)
	if i := bytes.LastIndexByte([]byte(p.Type), '/'); i >= 0 {
		p.Type = p.Type[i+1:]
	}
	return strconv.Itoa(status) + " " + p.Type
}

func (o *operator) call(ctx context.Context, hc *http.Client, method, url string, body []byte) (int, []byte) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, method, url, bytes.NewReader(body))
	if err != nil {
		return 0, nil
	}
	req.Header.Set("Authorization", "Bearer "+operatorKey)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, b
}
