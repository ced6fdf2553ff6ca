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
	// begin so is not read; its capture then shows as missing_internal.
	TimeOrderedIDs bool
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
	Type      Type   `json:"type"`
	Reference string `json:"reference"`
	Merchant  string `json:"merchant"`
	OrderID   int64  `json:"order_id"`
	// Ours is our charge's side, empty when we have no charge.
	OurStatus      string    `json:"our_status,omitempty"`
	OurAmountCents int64     `json:"our_amount_cents,omitempty"`
	OurCurrency    string    `json:"our_currency,omitempty"`
	OurCreatedAt   time.Time `json:"our_created_at,omitzero"`
	// The acquirer's side: its first capture's status, amount and
	// currency, and the ids of every entry it has for the reference.
	AcquirerStatus      string   `json:"acquirer_status,omitempty"`
	AcquirerAmountCents int64    `json:"acquirer_amount_cents,omitempty"`
	AcquirerCurrency    string   `json:"acquirer_currency,omitempty"`
	AcquirerIDs         []string `json:"acquirer_ids,omitempty"`
	Detail              string   `json:"detail"`
}

// Report is a run's outcome.
type Report struct {
	Acquirer string    `json:"acquirer"`
	Period   string    `json:"period"`
	From     time.Time `json:"from"`
	To       time.Time `json:"to"`
	// Charges counts our charges created in the period; LedgerEntries the
	// acquirer's entries joined to the period's references.
	Charges       int `json:"charges"`
	LedgerEntries int `json:"ledger_entries"`
	// Matched counts the period's references on which both sides agree.
	Matched int `json:"matched"`
	// Counts has every type, zero included.
	Counts     map[Type]int `json:"counts"`
	Mismatches []Mismatch   `json:"mismatches"`
	// Clean is no mismatch of any type, pending included.
	Clean      bool      `json:"clean"`
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`
}

// Run reconciles the period of opts: it pages through our charges and the
// acquirer's ledger in reference order, joins them, and returns the report.
// It writes nothing (Save stores a report).
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
	r := &run{opts: opts, now: opts.Now(), report: &Report{
		Acquirer: opts.Acquirer, Period: opts.Period, From: opts.From.UTC(), To: opts.To.UTC(),
		Counts: make(map[Type]int, len(Types)), Mismatches: []Mismatch{}, StartedAt: time.Now().UTC(),
	}}
	for _, t := range Types {
		r.report.Counts[t] = 0
	}
	from, to := opts.From.Add(-opts.Margin), opts.To.Add(opts.Margin)
	ours := &ourStream{store: store, p: chargeonce.ReconChargesParams{From: from, To: to, Limit: opts.PageSize}}
	if opts.TimeOrderedIDs {
		ours.p.IDMin, ours.p.IDMax = chargeIDBound(from.Add(-IDClockSkew)), chargeIDBound(to.Add(IDClockSkew))
	}
	theirs := &ledgerStream{ledger: ledger, p: chargeonce.LedgerParams{From: from, To: to, Limit: opts.PageSize}}

	var group []chargeonce.LedgerEntry
	for {
		oc, err := ours.peek(ctx)
		if err != nil {
			return nil, err
		}
		le, err := theirs.peek(ctx)
		if err != nil {
			return nil, err
		}
		if oc == nil && le == nil {
			break
		}
		var ref string
		switch {
		case oc == nil:
			ref = le.ChargeReference
		case le == nil:
			ref = oc.ID
		default:
			ref = min(oc.ID, le.ChargeReference)
		}
		var our *chargeonce.Charge
		if oc != nil && oc.ID == ref {
			c := *oc
			our = &c
			ours.next()
		}
		group = group[:0]
		for {
			le, err := theirs.peek(ctx)
			if err != nil {
				return nil, err
			}
			if le == nil || le.ChargeReference != ref {
				break
			}
			group = append(group, *le)
			theirs.next()
		}
		r.join(ref, our, group)
	}
	rep := r.report
	rep.Clean = len(rep.Mismatches) == 0
	rep.FinishedAt = time.Now().UTC()
	return rep, nil
}

type run struct {
	opts   Options
	now    time.Time
	report *Report
}

func (r *run) inPeriod(t time.Time) bool {
	return !t.Before(r.opts.From) && t.Before(r.opts.To)
}

// join classifies one reference: our charge (nil when we have none) and
// the acquirer's entries for it, in the order it made them.
func (r *run) join(ref string, our *chargeonce.Charge, entries []chargeonce.LedgerEntry) {
	switch {
	case our != nil && !r.inPeriod(our.CreatedAt):
		return // another period's charge, read for the margin only
	case our == nil && (len(entries) == 0 || !r.inPeriod(entries[0].CreatedAt)):
		return
	}
	if our != nil {
		r.report.Charges++
	}
	r.report.LedgerEntries += len(entries)

	var (
		captures, captured []chargeonce.LedgerEntry
		refunded, capSum   int64
		ids                = make([]string, 0, len(entries))
	)
	for _, e := range entries {
		ids = append(ids, e.ID)
		switch e.Kind {
		case chargeonce.LedgerCapture:
			captures = append(captures, e)
			if e.Status == string(chargeonce.StatusCaptured) {
				captured = append(captured, e)
				capSum += e.AmountCents
			}
		case chargeonce.LedgerRefund:
			if e.Status != "failed" {
				refunded += e.AmountCents
			}
		}
	}
	m := Mismatch{Reference: ref, AcquirerIDs: ids}
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
		r.report.Mismatches = append(r.report.Mismatches, mm)
		r.report.Counts[t]++
		found++
	}
	young := our != nil && r.now.Sub(our.CreatedAt) < r.opts.SettlementWindow

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
		add(StatusMismatch, "captured by us, declined by the acquirer")
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
		}
		if c := captured[0]; !strings.EqualFold(c.Currency, our.Currency) {
			add(CurrencyMismatch, "we recorded %s, the acquirer captured %s", our.Currency, c.Currency)
		}
	}
	if our != nil && len(captured) > 1 {
		add(DuplicateForIntent, "the acquirer captured %d times under one reference", len(captured))
	}
	if refunded > capSum {
		add(RefundsExceedCapture, "refunds of %d exceed captures of %d (minor units)", refunded, capSum)
	}
	if found == 0 {
		r.report.Matched++
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
func Save(ctx context.Context, store chargeonce.ReconStore, rep *Report) (chargeonce.ReconRun, error) {
	body, err := json.Marshal(rep)
	if err != nil {
		return chargeonce.ReconRun{}, fmt.Errorf("recon: encoding the report: %w", err)
	}
	counts := make(map[string]int, len(rep.Counts))
	for t, n := range rep.Counts {
		counts[string(t)] = n
	}
	run, err := store.ReconRunSave(ctx, chargeonce.ReconRun{
		Acquirer: rep.Acquirer, Period: rep.Period, From: rep.From, To: rep.To, Counts: counts, Report: body,
	})
	if err != nil {
		return chargeonce.ReconRun{}, fmt.Errorf("recon: storing the run: %w", err)
	}
	return run, nil
}
