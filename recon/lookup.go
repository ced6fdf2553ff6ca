package recon

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/chargeonce/chargeonce"
)

// Looking a reference up on the other side before calling it missing.
//
// Both sides are read in the period and the margin (the read window). A
// request the acquirer received late, or an acquirer that settles late,
// puts its entry past the window's end while ours is in it; the next
// period then reads the acquirer's entry and not ours. Neither is missing:
// before a difference is called missing, each side is looked up by the
// reference outside the window.
//
//   - Our side, by the acquirer's entries in the period that have nothing
//     of ours in the window: our charge (chargeByID), our refunds of the
//     charge (refundsOf) and our capture or void of its authorization
//     (opOf), point reads by the reference, whenever they were made.
//   - The acquirer's side, for what we recorded in the period as money
//     moved that the window does not show: the ledger has no read by
//     reference (chargeonce.Ledger lists a time range), so it is read
//     after the window for Options.Lookahead, keeping only the entries of
//     such references (and from our charge's creation for a capture or
//     void of an authorization, which Stripe files under its
//     authorization's time).
//   - The acquirer's entries under one of our records found before the
//     window are joined with everything the acquirer has under the
//     reference since that record: a late capture is one capture, a second
//     capture long after the first is duplicate_for_intent.
//
// A reference needing the ledger past the window is deferred: joined once
// both extra reads are done. A pair joined so belongs to the period of the
// side read in it; it is compared in full, and named in the report's notes.

// deferredRef is one reference and what the stream, the look-ups and the
// reads past the window found for it.
type deferredRef struct {
	ref     string
	our     *chargeonce.Charge
	refunds []chargeonce.Refund
	ops     []chargeonce.ReconOperation
	group   []chargeonce.LedgerEntry
	// behind, when not zero, is how far back the acquirer's ledger is read
	// for the reference (up to the read window); ahead says it is read
	// after the window for the lookahead.
	behind time.Time
	ahead  bool
	// ourFound are the ids of ours found outside the read window; before
	// and after the acquirer's entries found outside it.
	ourFound      []string
	before, after []chargeonce.LedgerEntry
}

// has reports whether the window's read had e already: a ledger that reads
// by whole seconds (Stripe's) reads the second either side of the window
// twice.
func (d *deferredRef) has(e chargeonce.LedgerEntry) bool {
	return slices.ContainsFunc(d.group, func(g chargeonce.LedgerEntry) bool { return g.ID == e.ID && g.Kind == e.Kind })
}

// needsLedger reports whether the acquirer's ledger must be read past the
// window (from) for the reference before it is joined.
func (d *deferredRef) needsLedger(from time.Time) bool {
	return d.ahead || (!d.behind.IsZero() && d.behind.Before(from))
}

// readBack asks for the ledger from t on.
func (d *deferredRef) readBack(t time.Time) {
	if d.behind.IsZero() || t.Before(d.behind) {
		d.behind = t
	}
}

// lookOurs looks our side of the reference up where the acquirer shows in
// the period what the stream did not read of ours, and says what of ours
// in the period the window does not show at the acquirer. It allocates
// only for what it finds: it runs for every reference.
func (r *run) lookOurs(ctx context.Context, ref string, our *chargeonce.Charge, refunds []chargeonce.Refund, ops []chargeonce.ReconOperation, group []chargeonce.LedgerEntry) (deferredRef, error) {
	d := deferredRef{ref: ref, our: our, refunds: refunds, ops: ops}
	var captures, captureInPeriod, settlements, settlementInPeriod bool
	var unread []string // the acquirer's refund references in the period with no refund of ours read
	for _, e := range group {
		switch e.Kind {
		case chargeonce.LedgerCapture, chargeonce.LedgerAuthorization:
			captures = true
			captureInPeriod = captureInPeriod || r.inPeriod(e.CreatedAt)
		case chargeonce.LedgerManualCapture, chargeonce.LedgerVoid:
			settlements = true
			settlementInPeriod = settlementInPeriod || r.inPeriod(e.CreatedAt)
		case chargeonce.LedgerRefund:
			if r.inPeriod(e.CreatedAt) && !slices.Contains(unread, e.Reference) &&
				!slices.ContainsFunc(refunds, func(rf chargeonce.Refund) bool { return rf.ID == e.Reference }) {
				unread = append(unread, e.Reference)
			}
		}
	}
	found := func(id string, at time.Time) {
		d.ourFound = append(d.ourFound, id)
		if at.Before(r.readFrom()) {
			d.readBack(at.Add(-r.opts.Margin))
		}
	}

	// The acquirer's side in the period, ours outside the window.
	if our != nil && !r.inRead(our.CreatedAt) && captureInPeriod {
		found(our.ID, our.CreatedAt)
	}
	if len(unread) > 0 {
		ours, err := r.refundsOf(ctx, ref, unread)
		if err != nil {
			return d, err
		}
		if len(ours) > 0 {
			d.refunds = append(slices.Clone(refunds), ours...)
			for _, rf := range ours {
				found(rf.ID, rf.CreatedAt)
			}
		}
	}
	if len(ops) == 0 && settlementInPeriod {
		op, err := r.opOf(ctx, ref)
		if err != nil {
			return d, err
		}
		if op != nil {
			d.ops = []chargeonce.ReconOperation{*op}
			found(op.ID, op.SettledAt)
		}
	}

	// Ours in the period as money moved, nothing at the acquirer in the
	// window.
	if our != nil && r.inPeriod(our.CreatedAt) && our.CaptureMethod != chargeonce.CaptureManual &&
		our.Status == chargeonce.StatusCaptured && !captures {
		d.ahead = true
	}
	for _, rf := range d.refunds {
		if r.inPeriod(rf.CreatedAt) && rf.Status == chargeonce.RefundSucceeded &&
			!slices.ContainsFunc(group, func(e chargeonce.LedgerEntry) bool { return e.Kind == chargeonce.LedgerRefund && e.Reference == rf.ID }) {
			d.ahead = true
		}
	}
	if op := liveOp(d.ops); op != nil && op.Status == chargeonce.OperationSucceeded && r.inPeriod(op.SettledAt) && !settlements {
		d.ahead = true
		if our != nil {
			// Stripe files the capture or void under the authorization's
			// creation, not when it settled.
			d.readBack(our.CreatedAt.Add(-r.opts.Margin))
		}
	}
	return d, nil
}

// liveOp is the operation joinOperation compares: the succeeded one, else
// the first.
func liveOp(ops []chargeonce.ReconOperation) *chargeonce.ReconOperation {
	var live *chargeonce.ReconOperation
	for i := range ops {
		if live == nil || ops[i].Status == chargeonce.OperationSucceeded {
			live = &ops[i]
		}
	}
	return live
}

// refundsOf returns our refunds of the charge ref whose ids are in ids,
// whenever they were made.
func (r *run) refundsOf(ctx context.Context, ref string, ids []string) ([]chargeonce.Refund, error) {
	if ref == "" || !chargeonce.ValidText(ref) {
		return nil, nil
	}
	p := chargeonce.ReconRefundsParams{From: pointRange.from, To: pointRange.to, AfterCharge: ref, ChargeMax: ref + "\x01", Limit: r.opts.PageSize}
	var out []chargeonce.Refund
	refunds := pages(ctx, p, func(ctx context.Context, p chargeonce.ReconRefundsParams) ([]chargeonce.Refund, chargeonce.ReconRefundsParams, bool, error) {
		page, err := r.store.RefundsListByChargeReference(ctx, p)
		if err != nil || len(page) == 0 {
			return nil, p, false, err
		}
		last := page[len(page)-1]
		p.AfterCharge, p.AfterID = last.ChargeID, last.ID
		return page, p, len(page) == p.Limit && last.ChargeID == ref, nil
	})
	for rf, err := range refunds {
		if err != nil {
			return nil, fmt.Errorf("recon: reading our refunds of %q: %w", ref, err)
		}
		if rf.ChargeID == ref && slices.Contains(ids, rf.ID) {
			out = append(out, rf)
		}
	}
	return out, nil
}

// opOf returns our capture or cancel of the authorization ref, pending or
// succeeded, whenever it settled; nil when we have none.
func (r *run) opOf(ctx context.Context, ref string) (*chargeonce.ReconOperation, error) {
	if ref == "" || !chargeonce.ValidText(ref) {
		return nil, nil
	}
	ops, err := r.store.OperationsListByChargeReference(ctx, chargeonce.ReconOperationsParams{
		From: pointRange.from, To: pointRange.to, ChargeMin: ref, ChargeMax: ref + "\x01", Limit: 1,
	})
	if err != nil {
		return nil, fmt.Errorf("recon: reading our capture or cancel of %q: %w", ref, err)
	}
	if len(ops) == 0 || ops[0].ChargeID != ref {
		return nil, nil
	}
	return &ops[0], nil
}

// resolveDeferred reads the acquirer's ledger past the window for the
// deferred references — once before it, from the earliest record of ours
// found there, and once after it for the lookahead — keeping only their
// entries, and joins each reference with them.
func (r *run) resolveDeferred(ctx context.Context) error {
	if len(r.deferred) == 0 {
		return nil
	}
	byRef := make(map[string]*deferredRef, len(r.deferred))
	from, back, ahead := r.readFrom(), false, false
	for _, d := range r.deferred {
		byRef[d.ref] = d
		if !d.behind.IsZero() && d.behind.Before(r.readFrom()) {
			back = true
			if d.behind.Before(from) {
				from = d.behind
			}
		}
		ahead = ahead || d.ahead
	}
	if back {
		err := r.scanLedger(ctx, from, r.readFrom(), func(e chargeonce.LedgerEntry) {
			// Every entry the read returns for the reference, also one
			// dated a little before our record: a ledger may date by
			// whole seconds (Stripe's), or by a clock behind ours.
			if d := byRef[e.ChargeReference]; d != nil && !d.behind.IsZero() && !d.has(e) {
				d.before = append(d.before, e)
			}
		})
		if err != nil {
			return err
		}
	}
	if ahead {
		err := r.scanLedger(ctx, r.readTo(), r.readTo().Add(r.opts.Lookahead), func(e chargeonce.LedgerEntry) {
			if d := byRef[e.ChargeReference]; d != nil && d.ahead && !d.has(e) {
				d.after = append(d.after, e)
			}
		})
		if err != nil {
			return err
		}
	}
	for _, d := range r.deferred {
		r.join(d.ref, d.our, d.refunds, d.ops, slices.Concat(d.before, d.group, d.after))
		r.noteFound(d, slices.Concat(d.before, d.after))
	}
	r.deferred = nil
	return nil
}

// scanLedger reads the acquirer's ledger in [from, to), handing keep each
// entry.
func (r *run) scanLedger(ctx context.Context, from, to time.Time, keep func(chargeonce.LedgerEntry)) error {
	if !from.Before(to) {
		return nil
	}
	for e, err := range ledgerPages(ctx, r.ledger, chargeonce.LedgerParams{From: from, To: to, Limit: r.opts.PageSize}) {
		if err != nil {
			return err
		}
		keep(e)
	}
	return nil
}

// noteFound notes a reference joined with what was found of it outside
// the read window, if anything was.
func (r *run) noteFound(d *deferredRef, theirs []chargeonce.LedgerEntry) {
	if len(d.ourFound) == 0 && len(theirs) == 0 {
		return
	}
	n := Note{Reference: d.ref, OurIDs: d.ourFound}
	switch {
	case d.our != nil:
		n.Merchant = d.our.MerchantID
	case len(d.group) > 0:
		n.Merchant = d.group[0].Merchant
	}
	var parts []string
	if len(d.ourFound) > 0 {
		parts = append(parts, fmt.Sprintf("%d record(s) of ours made outside it (%s)", len(d.ourFound), strings.Join(d.ourFound, ", ")))
	}
	if len(theirs) > 0 {
		for _, e := range theirs {
			n.AcquirerIDs = append(n.AcquirerIDs, e.ID)
		}
		parts = append(parts, fmt.Sprintf("%d entr(ies) of the acquirer's made outside it (%s)", len(theirs), strings.Join(n.AcquirerIDs, ", ")))
	}
	n.Detail = fmt.Sprintf("joined across the read window %s to %s: %s, found by the reference",
		r.readFrom().UTC().Format(time.RFC3339), r.readTo().UTC().Format(time.RFC3339), strings.Join(parts, "; "))
	r.report.Notes = append(r.report.Notes, n)
}
