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
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
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
	ours := &ourStream{store: store, p: chargeonce.ReconChargesParams{From: from, To: to, Limit: opts.PageSize}}
	refunds := &refundStream{store: store, p: chargeonce.ReconRefundsParams{From: from, To: to, Limit: opts.PageSize}}
	ops := &opStream{store: store, p: chargeonce.ReconOperationsParams{From: from, To: to, Limit: opts.PageSize}}
	if opts.TimeOrderedIDs {
		ours.p.IDMin, ours.p.IDMax = chargeIDBound(from.Add(-IDClockSkew)), chargeIDBound(to.Add(IDClockSkew))
		refunds.p.ChargeMax, ops.p.ChargeMax = ours.p.IDMax, ours.p.IDMax
	}
	theirs := &ledgerStream{ledger: ledger, p: chargeonce.LedgerParams{From: from, To: to, Limit: opts.PageSize}}

	var (
		group     []chargeonce.LedgerEntry
		ourRefund []chargeonce.Refund
		ourOps    []chargeonce.ReconOperation
	)
	for {
		oc, err := ours.peek(ctx)
		if err != nil {
			return nil, err
		}
		or, err := refunds.peek(ctx)
		if err != nil {
			return nil, err
		}
		oo, err := ops.peek(ctx)
		if err != nil {
			return nil, err
		}
		le, err := theirs.peek(ctx)
		if err != nil {
			return nil, err
		}
		if oc == nil && or == nil && oo == nil && le == nil {
			break
		}
		var refs []string
		if oc != nil {
			refs = append(refs, oc.ID)
		}
		if or != nil {
			refs = append(refs, or.ChargeID)
		}
		if oo != nil {
			refs = append(refs, oo.ChargeID)
		}
		if le != nil {
			refs = append(refs, le.ChargeReference)
		}
		ref := slices.Min(refs)
		var our *chargeonce.Charge
		if oc != nil && oc.ID == ref {
			c := *oc
			our = &c
			ours.next()
		}
		if ourRefund, err = takeRef(ctx, refunds, ref, ourRefund[:0], func(r *chargeonce.Refund) string { return r.ChargeID }); err != nil {
			return nil, err
		}
		if ourOps, err = takeRef(ctx, ops, ref, ourOps[:0], func(o *chargeonce.ReconOperation) string { return o.ChargeID }); err != nil {
			return nil, err
		}
		if group, err = takeRef(ctx, theirs, ref, group[:0], func(e *chargeonce.LedgerEntry) string { return e.ChargeReference }); err != nil {
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
	var chargeInPeriod bool
	switch {
	case our != nil && r.inRead(our.CreatedAt):
		chargeInPeriod = r.inPeriod(our.CreatedAt)
	case our != nil:
		// Our charge was made outside the read window (looked up by its
		// reference): the acquirer's capture in the period is compared
		// with it here, a late one or a second one.
		chargeInPeriod = r.anyInPeriod(captures)
	case len(captures) > 0:
		chargeInPeriod = r.inPeriod(captures[0].CreatedAt)
	}
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

// joinCapture compares our charge with the acquirer's captures under its
// reference and reports what differs; it returns how many mismatches.
func (r *run) joinCapture(ref string, our *chargeonce.Charge, captures []chargeonce.LedgerEntry, joinedBy string) int {
	var captured []chargeonce.LedgerEntry
	ids := make([]string, 0, len(captures))
	for _, e := range captures {
		ids = append(ids, e.ID)
		if e.Status == string(chargeonce.StatusCaptured) {
			captured = append(captured, e)
		}
	}
	m := Mismatch{Kind: chargeonce.LedgerCapture, Reference: ref, AcquirerIDs: ids, JoinedBy: joinedBy}
	if our != nil {
		m.Merchant, m.OrderID = our.MerchantID, our.OrderID
		m.OurStatus, m.OurAmountCents, m.OurCurrency, m.OurCreatedAt = string(our.Status), our.AmountCents, our.Currency, our.CreatedAt.UTC()
	}
	if len(captures) > 0 {
		first := captures[0]
		if len(captured) > 0 {
			first = captured[0]
		}
		if our == nil {
			m.Merchant, m.OrderID = first.Merchant, first.OrderID
		}
		m.AcquirerStatus, m.AcquirerAmountCents, m.AcquirerCurrency = first.Status, first.AmountCents, first.Currency
	}
	found := 0
	add := func(t Type, format string, args ...any) {
		mm := m
		mm.Type, mm.Detail = t, fmt.Sprintf(format, args...)
		r.add(mm)
		found++
	}
	young := our != nil && r.now.Sub(our.CreatedAt) < r.opts.SettlementWindow

	if our != nil && our.CaptureMethod == chargeonce.CaptureManual &&
		(our.Status == chargeonce.StatusAuthorized || our.Status == chargeonce.StatusCaptured || our.Status == chargeonce.StatusCanceled) {
		// An authorization: it moved no money, and its capture or void is
		// compared on the day it settled (joinOperation). Money the
		// acquirer took outright under its reference is a mismatch.
		if len(captured) > 0 {
			add(StatusMismatch, "authorized by us (manual capture), captured outright by the acquirer")
		}
		if len(captured) > 1 {
			add(DuplicateForIntent, "the acquirer captured %d times under one reference", len(captured))
		}
		return found
	}
	switch {
	case our == nil:
		if len(captured) > 0 {
			add(MissingInternal, "the acquirer captured %d time(s) under a reference we have no charge for", len(captured))
		}
	case our.Status == chargeonce.StatusCaptured && len(captures) == 0:
		if young {
			add(Pending, "captured by us %s ago; the acquirer shows nothing yet", r.now.Sub(our.CreatedAt).Round(time.Second))
		} else {
			add(MissingAtAcquirer, "captured by us; the acquirer has no capture under the reference")
		}
	case our.Status == chargeonce.StatusCaptured && len(captured) == 0:
		add(StatusMismatch, "captured by us, %s at the acquirer", m.AcquirerStatus)
	case our.Status == chargeonce.StatusDeclined && len(captured) > 0:
		add(StatusMismatch, "declined by us, captured by the acquirer")
	case our.Status == chargeonce.StatusProcessing && len(captures) > 0:
		if young {
			add(Pending, "processing with us; the acquirer has settled it %s", m.AcquirerStatus)
		} else {
			add(StatusMismatch, "still processing with us past the settlement window; the acquirer has it %s", m.AcquirerStatus)
		}
	case our.Status == chargeonce.StatusProcessing && young:
		add(Pending, "processing with us; the acquirer shows nothing yet")
	}
	if our != nil && len(captured) > 0 {
		if c := captured[0]; c.AmountCents != our.AmountCents {
			add(AmountMismatch, "we recorded %d, the acquirer captured %d (minor units)", our.AmountCents, c.AmountCents)
		} else if our.CapturedCents != 0 && our.CapturedCents != c.AmountCents {
			// An automatic charge has no captured_cents (NULL): one set
			// bounds its refunds instead of its amount.
			m.OurAmountCents = our.CapturedCents
			add(AmountMismatch, "the charge's captured_cents is %d (it bounds its refunds); the acquirer captured %d (minor units)", our.CapturedCents, c.AmountCents)
			m.OurAmountCents = our.AmountCents
		}
		if c := captured[0]; !strings.EqualFold(c.Currency, our.Currency) {
			add(CurrencyMismatch, "we recorded %s, the acquirer captured %s", our.Currency, c.Currency)
		}
	}
	if our != nil && len(captured) > 1 {
		add(DuplicateForIntent, "the acquirer captured %d times under one reference", len(captured))
	}
	return found
}

// opKind is the ledger kind of our capture or cancel of an authorization.
func opKind(op *chargeonce.ReconOperation) chargeonce.LedgerKind {
	if op.Kind == chargeonce.KindCancel {
		return chargeonce.LedgerVoid
	}
	return chargeonce.LedgerManualCapture
}

// joinOperation compares how an authorization was settled on both sides:
// our capture or cancel of the charge ref (at most one pending or
// succeeded, ops) with the acquirer's captures and voids of its
// authorization (settlements), joined by the charge's reference. An
// acquirer need not keep the operation's own reference (Stripe captures
// and cancels the PaymentIntent itself), and an authorization settles once,
// so the charge's reference is the join key on both sides. The settlement
// belongs to the period by when ours settled, else by the acquirer's first.
// It returns how many mismatches it found and whether a settlement was in
// the period.
func (r *run) joinOperation(ref string, our *chargeonce.Charge, ops []chargeonce.ReconOperation, settlements []chargeonce.LedgerEntry) (found int, touched bool) {
	ours := liveOp(ops)
	var inPeriod bool
	switch {
	case ours != nil && r.inRead(ours.SettledAt):
		inPeriod = r.inPeriod(ours.SettledAt)
	case ours != nil:
		// Ours settled outside the read window (looked up by the
		// charge's reference): compared here with the acquirer's
		// settlement in the period.
		inPeriod = r.anyInPeriod(settlements)
	case len(settlements) > 0:
		inPeriod = r.inPeriod(settlements[0].CreatedAt)
	}
	if !inPeriod {
		return 0, false
	}
	var caps, voids []chargeonce.LedgerEntry
	m := Mismatch{Reference: ref}
	for _, e := range settlements {
		m.AcquirerIDs = append(m.AcquirerIDs, e.ID)
		if e.Status != string(chargeonce.OperationSucceeded) {
			continue
		}
		if e.Kind == chargeonce.LedgerVoid {
			voids = append(voids, e)
		} else {
			caps = append(caps, e)
		}
	}
	r.report.LedgerEntries += len(settlements)
	if our != nil {
		m.Merchant, m.OrderID = our.MerchantID, our.OrderID
	}
	if len(settlements) > 0 {
		first := settlements[0]
		if moved := slices.Concat(caps, voids); len(moved) > 0 {
			first = moved[0]
		}
		m.Kind, m.ObjectReference = first.Kind, first.Reference
		if our == nil {
			m.Merchant, m.OrderID = first.Merchant, first.OrderID
		}
		m.AcquirerStatus, m.AcquirerAmountCents, m.AcquirerCurrency = first.Status, first.AmountCents, first.Currency
	}
	if ours != nil && r.inPeriod(ours.SettledAt) {
		r.report.Operations++
		if ms := r.merchant(ours.MerchantID); ms != nil {
			ms.Operations++
		}
	}
	if ours != nil {
		m.Kind, m.ObjectReference, m.Merchant = opKind(ours), ours.ID, ours.MerchantID
		m.OurStatus, m.OurAmountCents, m.OurCurrency, m.OurCreatedAt = string(ours.Status), ours.AmountCents, ours.Currency, ours.CreatedAt.UTC()
	}
	add := func(t Type, format string, args ...any) {
		mm := m
		mm.Type, mm.Detail = t, fmt.Sprintf(format, args...)
		r.add(mm)
		found++
	}
	young := ours != nil && r.now.Sub(ours.SettledAt) < r.opts.SettlementWindow
	switch {
	case ours == nil:
		// A void we did not record moved no money (the authorization is
		// released; ours expires and is voided by the sweeper).
		if len(caps) > 0 {
			add(MissingInternal, "the acquirer captured the authorization %d time(s); we recorded no capture of it", len(caps))
		}
	case ours.Status == chargeonce.OperationPending:
		switch {
		case len(caps)+len(voids) > 0 && young:
			add(Pending, "our %s is pending; the acquirer has settled the authorization (%s)", m.Kind, m.AcquirerStatus)
		case len(caps)+len(voids) > 0:
			add(StatusMismatch, "our %s is still pending past the settlement window; the acquirer has settled the authorization (%s)", m.Kind, m.AcquirerStatus)
		case young:
			add(Pending, "our %s is pending; the acquirer shows nothing yet", m.Kind)
		}
	case ours.Kind == chargeonce.KindCancel:
		switch {
		case len(caps) > 0:
			m.AcquirerStatus, m.AcquirerAmountCents, m.AcquirerCurrency = caps[0].Status, caps[0].AmountCents, caps[0].Currency
			add(StatusMismatch, "voided by us, captured (%d minor units) by the acquirer", caps[0].AmountCents)
		case len(voids) > 0:
		case young:
			add(Pending, "voided by us %s ago; the acquirer shows nothing yet", r.now.Sub(ours.SettledAt).Round(time.Second))
		default:
			add(MissingAtAcquirer, "voided by us; the acquirer has no void of the authorization")
		}
	default: // our capture succeeded
		switch {
		case len(caps) > 0:
			// Our capture's amount, and what the charge shows captured
			// (captured_cents: what the API answers and what bounds its
			// refunds), against the acquirer's.
			c := caps[0]
			switch {
			case c.AmountCents != ours.AmountCents:
				shown := ""
				if our != nil && our.AmountCaptured() != ours.AmountCents {
					shown = fmt.Sprintf("; the charge shows %d captured", our.AmountCaptured())
				}
				add(AmountMismatch, "we captured %d, the acquirer %d of the authorization (minor units)%s", ours.AmountCents, c.AmountCents, shown)
			case our != nil && our.Status != chargeonce.StatusCaptured:
				add(StatusMismatch, "our capture %s and the acquirer's (%d) succeeded, but the charge shows %s", ours.ID, c.AmountCents, our.Status)
			case our != nil && our.CapturedCents != c.AmountCents:
				m.OurAmountCents = our.CapturedCents
				add(AmountMismatch, "the charge shows %d captured (captured_cents, which bounds its refunds); our capture %s and the acquirer captured %d (minor units)",
					our.CapturedCents, ours.ID, c.AmountCents)
				m.OurAmountCents = ours.AmountCents
			}
			if c := caps[0]; !strings.EqualFold(c.Currency, ours.Currency) {
				add(CurrencyMismatch, "we captured in %s, the acquirer in %s", ours.Currency, c.Currency)
			}
			if len(caps) > 1 {
				add(DuplicateForIntent, "the acquirer captured the authorization %d times", len(caps))
			}
		case len(voids) > 0:
			add(StatusMismatch, "captured by us, voided by the acquirer")
		case young:
			add(Pending, "captured by us %s ago; the acquirer shows nothing yet", r.now.Sub(ours.SettledAt).Round(time.Second))
		default:
			add(MissingAtAcquirer, "captured by us; the acquirer has no capture of the authorization")
		}
	}
	return found, true
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
		var inPeriod bool
		switch {
		case p.ours != nil && r.inRead(p.ours.CreatedAt):
			inPeriod = r.inPeriod(p.ours.CreatedAt)
		case p.ours != nil:
			// Ours was made outside the read window (looked up by its
			// reference): compared here with the acquirer's in the period.
			inPeriod = r.anyInPeriod(p.theirs)
		default:
			inPeriod = r.inPeriod(p.theirs[0].CreatedAt)
		}
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

// joinRefund compares one refund reference's two sides.
func (r *run) joinRefund(ref, key string, charge *chargeonce.Charge, p *refundPair) int {
	m := Mismatch{Kind: chargeonce.LedgerRefund, Reference: ref, ObjectReference: key}
	if charge != nil {
		m.OrderID = charge.OrderID
	}
	var moved []chargeonce.LedgerEntry
	for _, e := range p.theirs {
		m.AcquirerIDs = append(m.AcquirerIDs, e.ID)
		if movesMoney(e) {
			moved = append(moved, e)
		}
	}
	if len(p.theirs) > 0 {
		first := p.theirs[0]
		if len(moved) > 0 {
			first = moved[0]
		}
		m.Merchant = first.Merchant
		m.AcquirerStatus, m.AcquirerAmountCents, m.AcquirerCurrency = first.Status, first.AmountCents, first.Currency
	}
	ours := p.ours
	if ours != nil {
		m.Merchant = ours.MerchantID
		m.OurStatus, m.OurAmountCents, m.OurCurrency, m.OurCreatedAt = string(ours.Status), ours.AmountCents, ours.Currency, ours.CreatedAt.UTC()
	}
	found := 0
	add := func(t Type, format string, args ...any) {
		mm := m
		mm.Type, mm.Detail = t, fmt.Sprintf(format, args...)
		r.add(mm)
		found++
	}
	young := ours != nil && r.now.Sub(ours.CreatedAt) < r.opts.SettlementWindow
	switch {
	case ours == nil:
		if len(moved) > 0 {
			add(MissingInternal, "the acquirer refunded %d time(s) under a reference we have no refund for", len(moved))
		}
	case ours.Status == chargeonce.RefundSucceeded && len(p.theirs) == 0:
		if young {
			add(Pending, "refunded by us %s ago; the acquirer shows nothing yet", r.now.Sub(ours.CreatedAt).Round(time.Second))
		} else {
			add(MissingAtAcquirer, "refunded by us; the acquirer has no refund under the reference")
		}
	case ours.Status == chargeonce.RefundSucceeded && len(moved) == 0:
		add(StatusMismatch, "refunded by us, %s at the acquirer", m.AcquirerStatus)
	case (ours.Status == chargeonce.RefundFailed || ours.Status == chargeonce.RefundCanceled) && len(moved) > 0:
		add(StatusMismatch, "%s with us, %s at the acquirer", ours.Status, m.AcquirerStatus)
	case ours.Status == chargeonce.RefundPending && len(p.theirs) > 0:
		if young {
			add(Pending, "pending with us; the acquirer has it %s", m.AcquirerStatus)
		} else {
			add(StatusMismatch, "still pending with us past the settlement window; the acquirer has it %s", m.AcquirerStatus)
		}
	case ours.Status == chargeonce.RefundPending && young:
		add(Pending, "pending with us; the acquirer shows nothing yet")
	}
	if ours != nil && len(moved) > 0 {
		if c := moved[0]; c.AmountCents != ours.AmountCents {
			add(AmountMismatch, "we refunded %d, the acquirer %d (minor units)", ours.AmountCents, c.AmountCents)
		}
		if c := moved[0]; !strings.EqualFold(c.Currency, ours.Currency) {
			add(CurrencyMismatch, "we refunded in %s, the acquirer in %s", ours.Currency, c.Currency)
		}
	}
	if ours != nil && len(moved) > 1 {
		add(DuplicateForIntent, "the acquirer refunded %d times under one refund reference", len(moved))
	}
	return found
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

// stream is one side of the join, read in reference order.
type stream[T any] interface {
	peek(ctx context.Context) (*T, error)
	next()
}

// takeRef appends to dst, and takes off s, the items at its head whose
// charge reference (ref of an item) is ref.
func takeRef[T any](ctx context.Context, s stream[T], ref string, dst []T, refOf func(*T) string) ([]T, error) {
	for {
		v, err := s.peek(ctx)
		if err != nil {
			return dst, err
		}
		if v == nil || refOf(v) != ref {
			return dst, nil
		}
		dst = append(dst, *v)
		s.next()
	}
}

// ourStream pages through our charges in reference order.
type ourStream struct {
	store chargeonce.ReconStore
	p     chargeonce.ReconChargesParams
	buf   []chargeonce.Charge
	i     int
	done  bool
	last  string
}

func (s *ourStream) peek(ctx context.Context) (*chargeonce.Charge, error) {
	for s.i == len(s.buf) {
		if s.done {
			return nil, nil
		}
		page, err := s.store.ChargesListByReference(ctx, s.p)
		if err != nil {
			return nil, fmt.Errorf("recon: reading our charges after %q: %w", s.p.After, err)
		}
		for _, c := range page {
			if c.ID <= s.last && s.last != "" {
				return nil, fmt.Errorf("recon: our charges are not in byte order (%q after %q): the database's collation does not order charge ids as the acquirer's ledger does", c.ID, s.last)
			}
			s.last = c.ID
		}
		s.buf, s.i = page, 0
		s.done = len(page) < s.p.Limit
		if len(page) > 0 {
			s.p.After = page[len(page)-1].ID
		}
	}
	return &s.buf[s.i], nil
}

func (s *ourStream) next() { s.i++ }

// ledgerStream pages through the acquirer's ledger in reference order.
type ledgerStream struct {
	ledger  chargeonce.Ledger
	p       chargeonce.LedgerParams
	buf     []chargeonce.LedgerEntry
	i       int
	done    bool
	started bool
	last    string
}

func (s *ledgerStream) peek(ctx context.Context) (*chargeonce.LedgerEntry, error) {
	for s.i == len(s.buf) {
		if s.done {
			return nil, nil
		}
		page, err := s.ledger.LedgerList(ctx, s.p)
		if err != nil {
			return nil, fmt.Errorf("recon: reading the acquirer's ledger after %q: %w", s.p.After, err)
		}
		for _, e := range page.Entries {
			if s.started && cmp.Less(e.ChargeReference, s.last) {
				return nil, fmt.Errorf("recon: the acquirer's ledger is not in reference order (%q after %q)", e.ChargeReference, s.last)
			}
			s.last, s.started = e.ChargeReference, true
		}
		if page.Next != "" && (page.Next == s.p.After || len(page.Entries) == 0) {
			// A ledger whose cursor does not move would be read forever.
			return nil, fmt.Errorf("recon: the acquirer's ledger did not advance past %q", s.p.After)
		}
		s.buf, s.i = page.Entries, 0
		s.done = page.Next == ""
		s.p.After = page.Next
	}
	return &s.buf[s.i], nil
}

func (s *ledgerStream) next() { s.i++ }

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

// opStream pages through our captures and cancels of authorizations in
// charge reference order.
type opStream struct {
	store chargeonce.ReconStore
	p     chargeonce.ReconOperationsParams
	buf   []chargeonce.ReconOperation
	i     int
	done  bool
}

func (s *opStream) peek(ctx context.Context) (*chargeonce.ReconOperation, error) {
	for s.i == len(s.buf) {
		if s.done {
			return nil, nil
		}
		page, err := s.store.OperationsListByChargeReference(ctx, s.p)
		if err != nil {
			return nil, fmt.Errorf("recon: reading our captures and cancels after %q: %w", s.p.AfterCharge, err)
		}
		for _, op := range page {
			if op.ChargeID <= s.p.AfterCharge && s.p.AfterCharge != "" {
				return nil, fmt.Errorf("recon: our captures and cancels are not in byte order (%q after %q)", op.ChargeID, s.p.AfterCharge)
			}
			s.p.AfterCharge = op.ChargeID
		}
		s.buf, s.i = page, 0
		s.done = len(page) < s.p.Limit
	}
	return &s.buf[s.i], nil
}

func (s *opStream) next() { s.i++ }

// refundStream pages through our refunds in (charge reference, id) order.
type refundStream struct {
	store chargeonce.ReconStore
	p     chargeonce.ReconRefundsParams
	buf   []chargeonce.Refund
	i     int
	done  bool
}

func (s *refundStream) peek(ctx context.Context) (*chargeonce.Refund, error) {
	for s.i == len(s.buf) {
		if s.done {
			return nil, nil
		}
		page, err := s.store.RefundsListByChargeReference(ctx, s.p)
		if err != nil {
			return nil, fmt.Errorf("recon: reading our refunds after %q %q: %w", s.p.AfterCharge, s.p.AfterID, err)
		}
		for _, rf := range page {
			if rf.ChargeID < s.p.AfterCharge || (rf.ChargeID == s.p.AfterCharge && rf.ID <= s.p.AfterID && s.p.AfterID != "") {
				return nil, fmt.Errorf("recon: our refunds are not in byte order (%q %q after %q %q)", rf.ChargeID, rf.ID, s.p.AfterCharge, s.p.AfterID)
			}
			s.p.AfterCharge, s.p.AfterID = rf.ChargeID, rf.ID
		}
		s.buf, s.i = page, 0
		s.done = len(page) < s.p.Limit
	}
	return &s.buf[s.i], nil
}

func (s *refundStream) next() { s.i++ }
