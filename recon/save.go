package recon

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/chargeonce/chargeonce"
)

// Save stores rep as the run of (rep.Acquirer, rep.Period): the first run
// of the period is inserted, a re-run replaces it (chargeonce.ReconRun).
// Each merchant's share is stored with it, and the first run of a period
// writes each merchant's reconciliation.completed event: one per
// (acquirer, period, merchant), its object the share as the latest re-run
// left it. Merchants are told their own counts only; a mismatch whose
// acquirer object names no merchant is in the run's counts (and its
// metrics) alone.
func Save(ctx context.Context, store chargeonce.ReconStore, rep *Report) (chargeonce.ReconRun, error) {
	body, err := json.Marshal(rep)
	if err != nil {
		return chargeonce.ReconRun{}, fmt.Errorf("recon: encoding the report: %w", err)
	}
	counts := make(map[string]int, len(rep.Counts))
	for t, n := range rep.Counts {
		counts[string(t)] = n
	}
	merchants := make([]chargeonce.ReconMerchantRun, 0, len(rep.Merchants))
	for _, id := range slices.Sorted(maps.Keys(rep.Merchants)) {
		ms := rep.Merchants[id]
		mc := make(map[string]int, len(ms.Counts))
		for t, n := range ms.Counts {
			mc[string(t)] = n
		}
		merchants = append(merchants, chargeonce.ReconMerchantRun{
			MerchantID: id, Charges: ms.Charges, Refunds: ms.Refunds, Operations: ms.Operations, Matched: ms.Matched, Counts: mc,
		})
	}
	run, err := store.ReconRunSave(ctx, chargeonce.ReconRun{
		Acquirer: rep.Acquirer, Period: rep.Period, From: rep.From, To: rep.To, Counts: counts, Report: body,
		Merchants: merchants,
	})
	if err != nil {
		return chargeonce.ReconRun{}, fmt.Errorf("recon: storing the run: %w", err)
	}
	return run, nil
}
