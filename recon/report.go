package recon

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/chargeonce/chargeonce"
)

// WriteJSON writes the report as one indented JSON object.
func (rep *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(rep); err != nil {
		return fmt.Errorf("recon: writing the JSON report: %w", err)
	}
	return nil
}

// CSVHeader is the first row of the CSV report: one row per mismatch
// follows, acquirer_ids joined by spaces.
var CSVHeader = []string{
	"type", "reference", "merchant", "order_id",
	"our_status", "our_amount_cents", "our_currency", "our_created_at",
	"acquirer_status", "acquirer_amount_cents", "acquirer_currency", "acquirer_ids",
	"detail", "kind", "object_reference", "joined_by",
}

// WriteCSV writes the report's mismatches as CSV (RFC 4180), a header row
// first; a clean run writes the header alone.
func (rep *Report) WriteCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(CSVHeader); err != nil {
		return fmt.Errorf("recon: writing the CSV report: %w", err)
	}
	for _, m := range rep.Mismatches {
		created := ""
		if !m.OurCreatedAt.IsZero() {
			created = m.OurCreatedAt.Format(time.RFC3339Nano)
		}
		amount := func(n int64, set bool) string {
			if !set {
				return ""
			}
			return strconv.FormatInt(n, 10)
		}
		if err := cw.Write([]string{
			string(m.Type), m.Reference, m.Merchant, strconv.FormatInt(m.OrderID, 10),
			m.OurStatus, amount(m.OurAmountCents, m.OurStatus != ""), m.OurCurrency, created,
			m.AcquirerStatus, amount(m.AcquirerAmountCents, m.AcquirerStatus != ""), m.AcquirerCurrency,
			strings.Join(m.AcquirerIDs, " "), m.Detail, string(m.Kind), m.ObjectReference, m.JoinedBy,
		}); err != nil {
			return fmt.Errorf("recon: writing the CSV report: %w", err)
		}
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("recon: writing the CSV report: %w", err)
	}
	return nil
}

// WriteMetrics writes the report as Prometheus text exposition, for
// node_exporter's textfile collector (a cron job has no /metrics to
// scrape): the mismatches by type, the references matched, and when the run
// finished. Labels name the acquirer; the period is the run's, so the file
// holds the latest run.
func (rep *Report) WriteMetrics(w io.Writer) error {
	acq := strconv.Quote(rep.Acquirer) // Prometheus label values escape as Go strings do for ASCII
	var b strings.Builder
	b.WriteString("# HELP chargeonce_recon_mismatches Mismatches the latest reconciliation run found, by type.\n")
	b.WriteString("# TYPE chargeonce_recon_mismatches gauge\n")
	for _, t := range Types {
		fmt.Fprintf(&b, "chargeonce_recon_mismatches{acquirer=%s,type=%q} %d\n", acq, t, rep.Counts[t])
	}
	b.WriteString("# HELP chargeonce_recon_matched References on which the latest run found both sides agreeing.\n")
	b.WriteString("# TYPE chargeonce_recon_matched gauge\n")
	fmt.Fprintf(&b, "chargeonce_recon_matched{acquirer=%s} %d\n", acq, rep.Matched)
	b.WriteString("# HELP chargeonce_recon_last_run_timestamp_seconds When the latest run finished.\n")
	b.WriteString("# TYPE chargeonce_recon_last_run_timestamp_seconds gauge\n")
	fmt.Fprintf(&b, "chargeonce_recon_last_run_timestamp_seconds{acquirer=%s} %d\n", acq, rep.FinishedAt.Unix())
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("recon: writing metrics: %w", err)
	}
	return nil
}

// EncodeMerchantRun renders a merchant's share of a run as the API and the
// reconciliation.completed event's data.object show it.
func EncodeMerchantRun(m chargeonce.ReconMerchantRun) []byte {
	counts := make(map[string]int, len(Types))
	for _, t := range Types {
		counts[string(t)] = m.Counts[string(t)]
	}
	b, _ := json.Marshal(struct {
		ID         string         `json:"id"`
		Object     string         `json:"object"`
		Acquirer   string         `json:"acquirer"`
		Period     string         `json:"period"`
		From       string         `json:"from"`
		To         string         `json:"to"`
		Charges    int            `json:"charges"`
		Refunds    int            `json:"refunds"`
		Operations int            `json:"operations"`
		Matched    int            `json:"matched"`
		Mismatches int            `json:"mismatches"`
		Counts     map[string]int `json:"counts"`
		Runs       int            `json:"runs"`
		UpdatedAt  string         `json:"updated_at"`
	}{
		ID: m.ID, Object: "reconciliation_run", Acquirer: m.Acquirer, Period: m.Period,
		From: m.From.UTC().Format(time.RFC3339), To: m.To.UTC().Format(time.RFC3339),
		Charges: m.Charges, Refunds: m.Refunds, Operations: m.Operations, Matched: m.Matched, Mismatches: sum(counts), Counts: counts,
		Runs: m.Runs, UpdatedAt: m.UpdatedAt.UTC().Format(time.RFC3339Nano),
	})
	return b
}

func sum(counts map[string]int) int {
	n := 0
	for _, c := range counts {
		n += c
	}
	return n
}
