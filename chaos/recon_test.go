package chaos

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/postgres"
	"github.com/chargeonce/chargeonce/recon"
)

// reconcileAfterChaos reconciles the run's charges with the acquirer's
// ledger once the nemesis is over and every intent has its answer: a day of
// nemesis traffic reconciles clean. A charge still processing with us is
// recovery's business (the history's checker counts it as an intent whose
// answer is unknown), so its status_mismatch or pending is logged, not an
// error. The broken build (cfg.tags chaos_broken), which captures some
// charges twice, must be caught by reconciliation too: duplicate_for_intent.
func reconcileAfterChaos(t *testing.T, c *cluster, cfg config) {
	t.Helper()
	var url string
	switch {
	case c.ha != nil:
		url = c.ha.url()
	case c.failedOver:
		url = c.pair.Standby.URL()
	default:
		url = c.pg.URL()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	store, err := postgres.Open(ctx, url)
	if err != nil {
		t.Fatalf("recon after chaos: opening the database: %v", err)
	}
	defer store.Close()
	ledger := acquirer.NewClient("http://"+c.acq.Addr(), &http.Client{Timeout: 30 * time.Second})
	now := time.Now()
	rep, err := recon.Run(ctx, store, ledger, recon.Options{
		Acquirer: "chaos", Period: "chaos", From: now.Add(-6 * time.Hour), To: now.Add(time.Minute), TimeOrderedIDs: true,
	})
	if err != nil {
		t.Fatalf("recon after chaos: %v", err)
	}
	var wrong []string
	for _, m := range rep.Mismatches {
		if m.OurStatus == string(chargeonce.StatusProcessing) && (m.Type == recon.StatusMismatch || m.Type == recon.Pending) {
			t.Logf("recon after chaos: %s still processing with us: %s", m.Reference, m.Detail)
			continue
		}
		wrong = append(wrong, string(m.Type)+" "+m.Reference+": "+m.Detail)
	}
	t.Logf("recon after chaos: %d charges, %d refunds, %d ledger entries, %d matched, counts %v",
		rep.Charges, rep.Refunds, rep.LedgerEntries, rep.Matched, rep.Counts)
	if rep.Charges == 0 {
		t.Errorf("recon after chaos read no charge: the period or the database is wrong")
	}
	if strings.Contains(cfg.tags, "chaos_broken") {
		if rep.Counts[recon.DuplicateForIntent] == 0 {
			t.Errorf("recon after the broken build's run found no duplicate_for_intent; counts %v", rep.Counts)
		}
		return
	}
	if len(wrong) > 0 {
		t.Errorf("a day of nemesis traffic does not reconcile clean: %d mismatches:\n  %s", len(wrong), strings.Join(wrong, "\n  "))
	}
}
