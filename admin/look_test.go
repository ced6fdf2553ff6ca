package admin_test

import (
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/admin"
)

// TestTimelineCollapsesRepeats: seven identical failed lookups in a row are
// one line, "7 × lookup", with their time span; a different line between
// them, or a reason, keeps lines apart. Outcomes read in human words.
func TestTimelineCollapsesRepeats(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 6, 5, 20, 59, 0, time.UTC)
	var tl []chargeonce.HistoryEntry
	tl = append(tl, chargeonce.HistoryEntry{Kind: chargeonce.HistoryInserted, Actor: "attempt", Outcome: "processing", At: t0})
	for i := range 7 {
		tl = append(tl, chargeonce.HistoryEntry{Kind: chargeonce.HistoryKind("lookup"), Actor: "recovery", Outcome: "error",
			Detail: "dial tcp 127.0.0.1:9: connect: connection refused", At: t0.Add(time.Duration(i) * 10 * time.Second)})
	}
	tl = append(tl, chargeonce.HistoryEntry{Kind: chargeonce.HistoryResolveRefused, Actor: "admin:alice", Outcome: "refused: wanted captured", Reason: "ticket 1", At: t0.Add(time.Minute)})
	rows := admin.Collapse(tl)
	if len(rows) != 3 || rows[1].Count != 7 || !rows[1].At.Equal(t0) || !rows[1].Last.Equal(t0.Add(time.Minute)) || rows[2].Count != 1 {
		t.Fatalf("collapsed: %+v", rows)
	}
	if h := admin.Human(rows[1].HistoryEntry); h != "the acquirer could not be reached" {
		t.Errorf("human words for a refused connection: %q", h)
	}
}
