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

// Type is a kind of mismatch between our records and the acquirer's.
type Type string

// The mismatch types (SPEC "Reconciliation (v4)").
const (
	// MissingInternal is money at the acquirer under a reference we have no
	// charge for: the double-charge detector.
	MissingInternal Type = "missing_internal"
	// MissingAtAcquirer is a charge we say is captured of which the
	// acquirer has no record, past the settlement window.
	MissingAtAcquirer Type = "missing_at_acquirer"
	// AmountMismatch and CurrencyMismatch compare our charge with the
	// acquirer's capture under its reference.
	AmountMismatch   Type = "amount_mismatch"
	CurrencyMismatch Type = "currency_mismatch"
	// StatusMismatch is a charge whose status disagrees with the
	// acquirer's: declined by us and captured by them, captured by us and
	// declined by them, or still processing with us past the window.
	StatusMismatch Type = "status_mismatch"
	// DuplicateForIntent is more than one capture at the acquirer for one
	// reference: money moved twice for one intent.
	DuplicateForIntent Type = "duplicate_for_intent"
	// RefundsExceedCapture is refunds at the acquirer (not failed) adding
	// up to more than the reference's captures.
	RefundsExceedCapture Type = "refunds_exceed_capture"
	// Pending is a difference that may still resolve itself: a charge
	// younger than the settlement window that the acquirer does not show
	// yet, or that we still have processing. Past the window it is
	// reported as missing_at_acquirer or status_mismatch.
	Pending Type = "pending"
)

// Types lists every mismatch type, in report order.
var Types = []Type{
	MissingInternal, MissingAtAcquirer, AmountMismatch, CurrencyMismatch,
	StatusMismatch, DuplicateForIntent, RefundsExceedCapture, Pending,
}

// Defaults of the command's flags.
// Mismatch is one difference, for one reference.
type Mismatch struct {
	Type Type `json:"type"`
	// Kind is what the difference is about: a capture (our charge and the
	// acquirer's captures under its reference), a refund (our refund and
	// the acquirer's under the refund's reference), or the settlement of
	// an authorization, a manual_capture or a void (our capture or cancel
	// of the charge and the acquirer's captures and voids of its
	// authorization).
	Kind chargeonce.LedgerKind `json:"kind"`
	// Reference is the charge's reference (our charge id): the join key,
	// and the charge a refund's, a manual capture's or a void's mismatch
	// belongs to.
	Reference string `json:"reference"`
	// ObjectReference is the refund's reference (our refund id) for a
	// refund's mismatch, the operation's (our cp_… or vd_…, else the
	// acquirer's when it keeps one) for a manual capture's or a void's;
	// "" for a capture's.
	ObjectReference string `json:"object_reference,omitempty"`
	Merchant        string `json:"merchant"`
	OrderID         int64  `json:"order_id"`
	// Ours is our charge's (or refund's) side, empty when we have none.
	OurStatus      string    `json:"our_status,omitempty"`
	OurAmountCents int64     `json:"our_amount_cents,omitempty"`
	OurCurrency    string    `json:"our_currency,omitempty"`
	OurCreatedAt   time.Time `json:"our_created_at,omitzero"`
	// The acquirer's side: its first capture's (or refund's) status,
	// amount and currency, and the ids of every entry it has for the
	// reference.
	AcquirerStatus      string   `json:"acquirer_status,omitempty"`
	AcquirerAmountCents int64    `json:"acquirer_amount_cents,omitempty"`
	AcquirerCurrency    string   `json:"acquirer_currency,omitempty"`
	AcquirerIDs         []string `json:"acquirer_ids,omitempty"`
	// JoinedBy is "metadata" when the acquirer's object was joined to our
	// charge by the id in its metadata rather than by its reference.
	JoinedBy string `json:"joined_by,omitempty"`
	Detail   string `json:"detail"`
}

// Note is one reference joined across the read window: what was found
// beyond it, on which side, and why it was looked up.
type Note struct {
	Reference string `json:"reference"`
	Merchant  string `json:"merchant,omitempty"`
	// OurIDs are our charge, refunds and operations found by the
	// reference outside the read window; AcquirerIDs the acquirer's
	// entries found outside it.
	OurIDs      []string `json:"our_ids,omitempty"`
	AcquirerIDs []string `json:"acquirer_ids,omitempty"`
	Detail      string   `json:"detail"`
}

// MerchantSummary is one merchant's share of a run: what the
// reconciliation.completed event sent to that merchant carries.
type MerchantSummary struct {
	Charges    int          `json:"charges"`
	Refunds    int          `json:"refunds"`
	Operations int          `json:"operations"`
	Matched    int          `json:"matched"`
	Counts     map[Type]int `json:"counts"`
}

// Report is a run's outcome.
type Report struct {
	Acquirer string    `json:"acquirer"`
	Period   string    `json:"period"`
	From     time.Time `json:"from"`
	To       time.Time `json:"to"`
	// Charges counts our charges created in the period, Refunds our
	// refunds created in it, Operations our captures and cancels of
	// authorizations settled in it; LedgerEntries the acquirer's entries
	// joined to the period's references.
	Charges       int `json:"charges"`
	Refunds       int `json:"refunds"`
	Operations    int `json:"operations"`
	LedgerEntries int `json:"ledger_entries"`
	// Matched counts the period's references on which both sides agree.
	Matched int `json:"matched"`
	// Counts has every type, zero included.
	Counts map[Type]int `json:"counts"`
	// Merchants splits the run by merchant (our charge's, or the
	// acquirer's object's when we have none); a mismatch whose acquirer
	// object names no merchant is in Counts only.
	Merchants  map[string]*MerchantSummary `json:"merchants"`
	Mismatches []Mismatch                  `json:"mismatches"`
	// Notes name the references joined across the read window: one side
	// found by its reference past the period and margin read (the acquirer
	// settled it late, or our record was made before the window). They are
	// no mismatches: what disagrees is in Mismatches as well.
	Notes []Note `json:"notes"`
	// Clean is no mismatch of any type, pending included.
	Clean      bool      `json:"clean"`
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`
}

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
