package recon

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/chargeonce/chargeonce"
)

// join classifies one reference: our charge (nil when we have none), our
// refunds of it, our capture or cancel of its authorization, and the
// acquirer's entries for it, in the order it made them. The charge's
// capture (or authorization) belongs to the period by our charge's
// creation (the acquirer's first capture when we have no charge), each
// refund by its own (ours, else the acquirer's first entry for it), the
// authorization's capture or void by when ours settled (else the
// acquirer's first).
func (r *run) join(ref string, our *chargeonce.Charge, refunds []chargeonce.Refund, ops []chargeonce.ReconOperation, entries []chargeonce.LedgerEntry) {
	// captures are the charge's first drive at the acquirer: captures
	// (captured or declined) and authorizations; settlements the captures
	// and voids of its authorization.
	var captures, settlements []chargeonce.LedgerEntry
	for _, e := range entries {
		switch e.Kind {
		case chargeonce.LedgerCapture, chargeonce.LedgerAuthorization:
			captures = append(captures, e)
		case chargeonce.LedgerManualCapture, chargeonce.LedgerVoid:
			settlements = append(settlements, e)
		}
	}
	var made time.Time
	if our != nil {
		made = our.CreatedAt
	}
	chargeInPeriod := r.belongs(our != nil, made, captures)
	found, touched := 0, false
	if chargeInPeriod && our == nil && len(captures) > 0 && r.orphan(ref, captures) {
		// Kept for the charge its metadata names (resolveOrphans); the
		// rest of the reference (refunds under it) is still joined below.
		captures, chargeInPeriod = nil, false
	}
	if chargeInPeriod {
		touched = true
		found += r.joinCapture(ref, our, captures, "")
		if our != nil && r.inPeriod(our.CreatedAt) {
			r.report.Charges++
			if ms := r.merchant(our.MerchantID); ms != nil {
				ms.Charges++
			}
		}
		r.report.LedgerEntries += len(captures)
	}
	f, t := r.joinOperation(ref, our, ops, settlements)
	found += f
	touched = touched || t
	f, t = r.joinRefunds(ref, our, refunds, entries, slices.Concat(captures, settlements), chargeInPeriod)
	found += f
	touched = touched || t
	if touched && found == 0 {
		r.report.Matched++
		if our != nil {
			if ms := r.merchant(our.MerchantID); ms != nil {
				ms.Matched++
			}
		}
	}
}

// orphan keeps the captures of a reference we have no charge for when
// their metadata names another of our ids, to be joined with that charge
// at the end of the run; it reports whether it kept them.
func (r *run) orphan(ref string, captures []chargeonce.LedgerEntry) bool {
	meta := captures[0].MetaReference()
	if meta == "" || meta == ref {
		return false
	}
	for _, c := range captures {
		if c.MetaReference() != meta {
			return false
		}
	}
	r.orphans[meta] = append(r.orphans[meta], captures...)
	return true
}

// refundPair is one refund reference's two sides.
type refundPair struct {
	ours   *chargeonce.Refund
	theirs []chargeonce.LedgerEntry
}

// movesMoney reports whether an acquirer's refund entry gave (or is
// giving) money back: anything but failed or canceled.
func movesMoney(e chargeonce.LedgerEntry) bool {
	return e.Status != string(chargeonce.RefundFailed) && e.Status != string(chargeonce.RefundCanceled)
}

// joinRefunds compares our refunds of the charge ref with the acquirer's,
// by the refund's reference, and the money refunded with what was
// captured, on both sides. It returns how many mismatches it found and
// whether the reference had a refund in the period.
func (r *run) joinRefunds(ref string, our *chargeonce.Charge, refunds []chargeonce.Refund, entries, captures []chargeonce.LedgerEntry, chargeInPeriod bool) (found int, touched bool) {
	var (
		keys  []string
		pairs = map[string]*refundPair{}
	)
	pair := func(k string) *refundPair {
		p := pairs[k]
		if p == nil {
			p = &refundPair{}
			pairs[k] = p
			keys = append(keys, k)
		}
		return p
	}
	for i := range refunds {
		pair(refunds[i].ID).ours = &refunds[i]
	}
	for _, e := range entries {
		if e.Kind == chargeonce.LedgerRefund {
			p := pair(e.Reference)
			p.theirs = append(p.theirs, e)
		}
	}
	if len(keys) == 0 {
		return 0, false
	}
	slices.Sort(keys)
	var ourRefunded, theirRefunded int64
	merchant := ""
	if our != nil {
		merchant = our.MerchantID
	}
	for _, k := range keys {
		p := pairs[k]
		var made time.Time
		if p.ours != nil {
			made = p.ours.CreatedAt
		}
		inPeriod := r.belongs(p.ours != nil, made, p.theirs)
		if p.ours != nil && (p.ours.Status == chargeonce.RefundSucceeded || p.ours.Status == chargeonce.RefundPending) {
			ourRefunded += p.ours.AmountCents
		}
		for _, e := range p.theirs {
			if movesMoney(e) {
				theirRefunded += e.AmountCents
			}
		}
		if !inPeriod {
			continue
		}
		touched = true
		r.report.LedgerEntries += len(p.theirs)
		if p.ours != nil && r.inPeriod(p.ours.CreatedAt) {
			r.report.Refunds++
			if ms := r.merchant(p.ours.MerchantID); ms != nil {
				ms.Refunds++
			}
		}
		found += r.joinRefund(ref, k, our, p)
	}
	if !touched && !chargeInPeriod {
		return found, false
	}
	// What was captured, on each side: the acquirer's captures (and
	// captures of its authorization) read with the reference, or, for a
	// charge captured before the read began, our charge's captured amount
	// (its capture was compared with ours on its own day). For a charge
	// with manual capture that is what its capture took, not what was
	// authorized.
	var ourCaptured, theirCaptured int64
	if our != nil {
		ourCaptured = our.AmountCaptured()
	}
	took := false
	for _, e := range captures {
		switch e.Kind {
		case chargeonce.LedgerCapture, chargeonce.LedgerAuthorization:
			took = true
			if e.Status == string(chargeonce.StatusCaptured) {
				theirCaptured += e.AmountCents
			}
		case chargeonce.LedgerManualCapture:
			took = true
			if e.Status == string(chargeonce.OperationSucceeded) {
				theirCaptured += e.AmountCents
			}
		}
	}
	if !took && our != nil && !chargeInPeriod {
		theirCaptured = ourCaptured
	}
	if ourRefunded > ourCaptured || theirRefunded > theirCaptured {
		m := Mismatch{Type: RefundsExceedCapture, Kind: chargeonce.LedgerRefund, Reference: ref, Merchant: merchant,
			Detail: fmt.Sprintf("refunds of %d exceed captures of %d with us, refunds of %d exceed captures of %d at the acquirer (minor units)",
				ourRefunded, ourCaptured, theirRefunded, theirCaptured)}
		if our != nil {
			m.OrderID, m.OurStatus, m.OurAmountCents, m.OurCurrency, m.OurCreatedAt = our.OrderID, string(our.Status), our.AmountCents, our.Currency, our.CreatedAt.UTC()
		} else if len(entries) > 0 {
			m.Merchant = entries[0].Merchant
		}
		r.add(m)
		found++
	}
	return found, true
}

// resolveOrphans joins the captures kept by orphan with the charge their
// metadata names: a charge with nothing at the acquirer under its own
// reference is joined with them as if they were under it; a charge that
// was captured under its own reference as well was captured twice
// (duplicate_for_intent); an id we have no charge for leaves them
// missing_internal.
func (r *run) resolveOrphans(ctx context.Context) error {
	for _, meta := range slices.Sorted(maps.Keys(r.orphans)) {
		captures := r.orphans[meta]
		r.report.LedgerEntries += len(captures)
		our, err := r.chargeByID(ctx, meta)
		if err != nil {
			return err
		}
		if our == nil {
			r.joinCapture(captures[0].ChargeReference, nil, captures, "")
			continue
		}
		// What the stream said about the charge's own reference: its
		// capture's mismatches, and whether it was matched.
		var (
			before      []int
			seen        bool
			theirStatus string
		)
		for i, m := range r.report.Mismatches {
			if m.Reference != meta {
				continue
			}
			seen = true
			if m.Kind == chargeonce.LedgerCapture {
				before = append(before, i)
				if m.AcquirerStatus != "" {
					theirStatus = m.AcquirerStatus
				}
			}
		}
		read := !our.CreatedAt.Before(r.opts.From.Add(-r.opts.Margin)) && our.CreatedAt.Before(r.opts.To.Add(r.opts.Margin))
		inPeriod := r.inPeriod(our.CreatedAt)
		wasMatched := inPeriod && !seen
		capturedBefore := read && (theirStatus == string(chargeonce.StatusCaptured) ||
			(len(before) == 0 && our.Status == chargeonce.StatusCaptured))
		if capturedBefore {
			// Money moved under the charge's reference and again under another.
			m := Mismatch{Type: DuplicateForIntent, Kind: chargeonce.LedgerCapture, Reference: meta, Merchant: our.MerchantID, OrderID: our.OrderID,
				OurStatus: string(our.Status), OurAmountCents: our.AmountCents, OurCurrency: our.Currency, OurCreatedAt: our.CreatedAt.UTC(),
				AcquirerStatus: captures[0].Status, AcquirerAmountCents: captures[0].AmountCents, AcquirerCurrency: captures[0].Currency,
				JoinedBy: "metadata",
				Detail:   fmt.Sprintf("the acquirer captured again under reference %q, whose metadata names this charge", captures[0].ChargeReference)}
			for _, c := range captures {
				m.AcquirerIDs = append(m.AcquirerIDs, c.ID)
			}
			r.add(m)
		} else {
			// Nothing under the charge's own reference: these are its captures.
			r.remove(before)
			r.joinCapture(meta, our, captures, "metadata")
		}
		nowMatched := inPeriod && !slices.ContainsFunc(r.report.Mismatches, func(m Mismatch) bool { return m.Reference == meta })
		if d := b2i(nowMatched) - b2i(wasMatched); d != 0 {
			r.report.Matched += d
			if ms := r.merchant(our.MerchantID); ms != nil {
				ms.Matched += d
			}
		}
	}
	return nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// remove drops the mismatches at the indexes idx (ascending).
func (r *run) remove(idx []int) {
	for k := len(idx) - 1; k >= 0; k-- {
		m := r.report.Mismatches[idx[k]]
		r.report.Counts[m.Type]--
		if ms := r.report.Merchants[m.Merchant]; ms != nil {
			ms.Counts[m.Type]--
		}
		r.report.Mismatches = slices.Delete(r.report.Mismatches, idx[k], idx[k]+1)
	}
}
