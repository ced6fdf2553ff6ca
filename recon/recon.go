// Package recon reconciles our charges with an acquirer's ledger (SPEC
// "Reconciliation (v4)"): it proves, for a day, that every capture the
// acquirer made is one we know of, once, for the amount and currency we
// recorded, and names every difference.
//
// It is read-only. Both sides are read through interfaces
// (chargeonce.ReconStore for ours, chargeonce.Ledger for the acquirer's),
// each a page at a time in reference order, and merge-joined: memory holds
// one page of each side, the entries of one reference, and the mismatches
// found, never the day.
package recon

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/chargeonce/chargeonce"
)

const (
	// DefaultMargin is how far before and after the period both sides are
	// read, so that a charge created just before midnight and captured
	// just after it joins with its capture instead of showing up as
	// missing on both days.
	DefaultMargin = time.Hour
	// DefaultSettlementWindow is how long after its creation a charge's
	// difference is pending rather than a mismatch.
	DefaultSettlementWindow = time.Hour
	// DefaultLookahead is how far past the read window the acquirer's
	// ledger is searched for what we recorded in the period and it does
	// not show within the window: a request that reached it late, or an
	// acquirer that settles late.
	DefaultLookahead = 24 * time.Hour
)

// Options configure a run.
type Options struct {
	// Acquirer names the acquirer in the report and the stored run.
	Acquirer string
	// Period is the run's key ("2026-12-06", or "FROM/TO"); From and To
	// bound it: a reference belongs to the period when our charge was
	// created in [From, To), or, when we have none, when the acquirer's
	// first entry for it was.
	Period   string
	From, To time.Time
	// Margin widens the reading of both sides (not the period itself);
	// zero reads exactly [From, To).
	Margin time.Duration
	// SettlementWindow: a charge younger than this (at Now) that the
	// acquirer does not show, or that we have processing, is pending.
	SettlementWindow time.Duration
	// PageSize is the page size on both sides; zero is
	// chargeonce.ReconDefaultPage.
	PageSize int
	// Now is the clock that ages charges for the settlement window; nil is
	// time.Now.
	Now func() time.Time
	// TimeOrderedIDs says our charge ids begin with their creation time, as
	// idempotency.NewChargeID makes them ("ch_" and 12 hex digits of Unix
	// milliseconds): our side is then read only within the ids of the
	// period (with the margin and IDClockSkew), a stretch of the primary
	// key, instead of the key from its start. A charge whose id does not
	// begin so is not read from the period's ids; the acquirer's capture of
	// it is still joined with it, our charge looked up by its reference.
	TimeOrderedIDs bool
	// Lookahead: what we recorded in the period as money moved (a capture,
	// a refund, a capture or void of an authorization) that the acquirer's
	// ledger does not show within the read window is looked up in the
	// ledger from the window's end for Lookahead before it is called
	// missing_at_acquirer. Zero is DefaultLookahead.
	Lookahead time.Duration
}

// IDClockSkew is how far an instance's clock (which stamps a charge id) may
// be from the database's (which stamps created_at) for TimeOrderedIDs to
// still read the charge.
const IDClockSkew = time.Minute

// chargeIDBound is the smallest id idempotency.NewChargeID makes at t.
func chargeIDBound(t time.Time) string {
	return fmt.Sprintf("ch_%012x", max(t.UnixMilli(), 0))
}

// pointRange reads one charge by id through ChargesListByReference: the ids
// in [ref, ref+"\x01") are ref alone.
var pointRange = struct{ from, to time.Time }{time.Unix(0, 0).UTC(), time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)}

// Run reconciles the period of opts: it pages through our charges, our
// refunds and the acquirer's ledger in reference order, joins them, and
// returns the report. It writes nothing (Save stores a report).
func Run(ctx context.Context, store chargeonce.ReconStore, ledger chargeonce.Ledger, opts Options) (*Report, error) {
	if !opts.From.Before(opts.To) {
		return nil, fmt.Errorf("recon: the period must end after it starts; got %s to %s", opts.From, opts.To)
	}
	if opts.Margin < 0 || opts.SettlementWindow < 0 {
		return nil, errors.New("recon: the margin and the settlement window must not be negative")
	}
	if opts.PageSize == 0 {
		opts.PageSize = chargeonce.ReconDefaultPage
	}
	if opts.PageSize < 1 || opts.PageSize > chargeonce.ReconMaxPage {
		return nil, fmt.Errorf("recon: the page size must be 1 to %d; got %d", chargeonce.ReconMaxPage, opts.PageSize)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Lookahead < 0 {
		return nil, errors.New("recon: the lookahead must not be negative")
	}
	if opts.Lookahead == 0 {
		opts.Lookahead = DefaultLookahead
	}
	r := &run{opts: opts, now: opts.Now(), store: store, ledger: ledger, orphans: map[string][]chargeonce.LedgerEntry{}, report: &Report{
		Acquirer: opts.Acquirer, Period: opts.Period, From: opts.From.UTC(), To: opts.To.UTC(),
		Counts: make(map[Type]int, len(Types)), Merchants: map[string]*MerchantSummary{},
		Mismatches: []Mismatch{}, Notes: []Note{}, StartedAt: time.Now().UTC(),
	}}
	for _, t := range Types {
		r.report.Counts[t] = 0
	}
	from, to := opts.From.Add(-opts.Margin), opts.To.Add(opts.Margin)
	cp := chargeonce.ReconChargesParams{From: from, To: to, Limit: opts.PageSize}
	rp := chargeonce.ReconRefundsParams{From: from, To: to, Limit: opts.PageSize}
	op := chargeonce.ReconOperationsParams{From: from, To: to, Limit: opts.PageSize}
	if opts.TimeOrderedIDs {
		cp.IDMin, cp.IDMax = chargeIDBound(from.Add(-IDClockSkew)), chargeIDBound(to.Add(IDClockSkew))
		rp.ChargeMax, op.ChargeMax = cp.IDMax, cp.IDMax
	}
	ours, stop := pull(chargePages(ctx, store, cp), func(c *chargeonce.Charge) string { return c.ID })
	defer stop()
	refunds, stop := pull(refundPages(ctx, store, rp), func(rf *chargeonce.Refund) string { return rf.ChargeID })
	defer stop()
	ops, stop := pull(opPages(ctx, store, op), func(o *chargeonce.ReconOperation) string { return o.ChargeID })
	defer stop()
	theirs, stop := pull(ledgerPages(ctx, ledger, chargeonce.LedgerParams{From: from, To: to, Limit: opts.PageSize}),
		func(e *chargeonce.LedgerEntry) string { return e.ChargeReference })
	defer stop()

	var (
		charges   []chargeonce.Charge
		group     []chargeonce.LedgerEntry
		ourRefund []chargeonce.Refund
		ourOps    []chargeonce.ReconOperation
	)
	for {
		ref, ok, err := nextRef(ours, refunds, ops, theirs)
		if err != nil {
			return nil, err
		}
		if !ok {
			break
		}
		var our *chargeonce.Charge
		if charges, err = ours.take(ref, charges[:0]); err != nil {
			return nil, err
		}
		if len(charges) > 0 {
			c := charges[0]
			our = &c
		}
		if ourRefund, err = refunds.take(ref, ourRefund[:0]); err != nil {
			return nil, err
		}
		if ourOps, err = ops.take(ref, ourOps[:0]); err != nil {
			return nil, err
		}
		if group, err = theirs.take(ref, group[:0]); err != nil {
			return nil, err
		}
		if our == nil && (len(ourRefund) > 0 || len(ourOps) > 0 || len(group) > 0) {
			// A refund, a capture or a void of a charge made before the
			// read began: its charge tells what was authorized and
			// captured. Or the acquirer's entries under a reference whose
			// charge was not read: looked up before it is called missing.
			if our, err = r.chargeByID(ctx, ref); err != nil {
				return nil, err
			}
		}
		d, err := r.lookOurs(ctx, ref, our, ourRefund, ourOps, group)
		if err != nil {
			return nil, err
		}
		if d.needsLedger(r.readFrom()) {
			// Kept, with its own copies, until the ledger was read past
			// the window for it (resolveDeferred). Such references are
			// exceptions, so few.
			kept := d
			kept.group, kept.refunds, kept.ops = slices.Clone(group), slices.Clone(d.refunds), slices.Clone(d.ops)
			r.deferred = append(r.deferred, &kept)
			continue
		}
		r.join(ref, our, d.refunds, d.ops, group)
		r.noteFound(&d, nil)
	}
	if err := r.resolveDeferred(ctx); err != nil {
		return nil, err
	}
	if err := r.resolveOrphans(ctx); err != nil {
		return nil, err
	}
	rep := r.report
	// References joined after the stream (deferred, orphans) in order.
	slices.SortStableFunc(rep.Mismatches, func(a, b Mismatch) int { return strings.Compare(a.Reference, b.Reference) })
	slices.SortStableFunc(rep.Notes, func(a, b Note) int { return strings.Compare(a.Reference, b.Reference) })
	rep.Clean = len(rep.Mismatches) == 0
	rep.FinishedAt = time.Now().UTC()
	return rep, nil
}

type run struct {
	opts   Options
	now    time.Time
	store  chargeonce.ReconStore
	ledger chargeonce.Ledger
	report *Report
	// orphans are the acquirer's captures under a reference we have no
	// charge for whose metadata names another of our ids, by that id:
	// joined with it once the whole ledger was read (resolveOrphans). They
	// are exceptions, so few.
	orphans map[string][]chargeonce.LedgerEntry
	// deferred are the references joined once the acquirer's ledger was
	// read past the window for them (resolveDeferred): exceptions, so few.
	deferred []*deferredRef
}

func (r *run) inPeriod(t time.Time) bool {
	return !t.Before(r.opts.From) && t.Before(r.opts.To)
}

// readFrom and readTo bound the read window: the period and the margin.
func (r *run) readFrom() time.Time { return r.opts.From.Add(-r.opts.Margin) }
func (r *run) readTo() time.Time   { return r.opts.To.Add(r.opts.Margin) }

// inRead reports whether t is in the read window: a record of ours made
// then was read by the stream, one made outside it was looked up.
func (r *run) inRead(t time.Time) bool {
	return !t.Before(r.readFrom()) && t.Before(r.readTo())
}

// anyInPeriod reports whether one of the entries was made in the period.
func (r *run) anyInPeriod(entries []chargeonce.LedgerEntry) bool {
	return slices.ContainsFunc(entries, func(e chargeonce.LedgerEntry) bool { return r.inPeriod(e.CreatedAt) })
}

// belongs reports whether an object is the period's: by when ours was
// made (or settled, at) when the read window has it; when ours was made
// outside the window (looked up by its reference), by the acquirer's
// entries in the period (a late one, or a second one); when we have none
// (ours false), by the acquirer's first.
func (r *run) belongs(ours bool, at time.Time, theirs []chargeonce.LedgerEntry) bool {
	switch {
	case ours && r.inRead(at):
		return r.inPeriod(at)
	case ours:
		return r.anyInPeriod(theirs)
	case len(theirs) > 0:
		return r.inPeriod(theirs[0].CreatedAt)
	}
	return false
}

// chargeByID reads our charge ref, whenever it was made; nil when we have
// none.
func (r *run) chargeByID(ctx context.Context, ref string) (*chargeonce.Charge, error) {
	if ref == "" || !chargeonce.ValidText(ref) {
		return nil, nil
	}
	cs, err := r.store.ChargesListByReference(ctx, chargeonce.ReconChargesParams{
		From: pointRange.from, To: pointRange.to, IDMin: ref, IDMax: ref + "\x01", Limit: 1,
	})
	if err != nil {
		return nil, fmt.Errorf("recon: reading our charge %q: %w", ref, err)
	}
	if len(cs) == 0 || cs[0].ID != ref {
		return nil, nil
	}
	return &cs[0], nil
}

func (r *run) merchant(id string) *MerchantSummary {
	if id == "" {
		return nil
	}
	m := r.report.Merchants[id]
	if m == nil {
		m = &MerchantSummary{Counts: make(map[Type]int, len(Types))}
		for _, t := range Types {
			m.Counts[t] = 0
		}
		r.report.Merchants[id] = m
	}
	return m
}

func (r *run) add(m Mismatch) {
	r.report.Mismatches = append(r.report.Mismatches, m)
	r.report.Counts[m.Type]++
	if ms := r.merchant(m.Merchant); ms != nil {
		ms.Counts[m.Type]++
	}
}
