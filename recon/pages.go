package recon

import (
	"cmp"
	"context"
	"fmt"
	"iter"

	"github.com/chargeonce/chargeonce"
)

// Reading each side a page at a time, in reference order.
//
// One pager (pages) reads every listing: ours (charges, refunds, captures
// and cancels of authorizations) and the acquirer's ledger. What differs is
// the fetch: which listing, what its cursor is (the listing's parameters,
// moved past the page), when another page may follow, and the order the
// page must keep — a merge join of sides read in different orders would
// report what is not so.

// pages yields a listing's items a page at a time: fetch reads the page at
// cursor and returns it, the cursor of the page after it, and whether
// another may follow. An error ends the sequence, yielded with a zero item.
func pages[T, C any](ctx context.Context, cursor C, fetch func(ctx context.Context, cursor C) (page []T, next C, more bool, err error)) iter.Seq2[T, error] {
	return func(yield func(T, error) bool) {
		for {
			page, next, more, err := fetch(ctx, cursor)
			if err != nil {
				var zero T
				yield(zero, err)
				return
			}
			for _, v := range page {
				if !yield(v, nil) {
					return
				}
			}
			if !more {
				return
			}
			cursor = next
		}
	}
}

// chargePages reads our charges in reference (id) order.
func chargePages(ctx context.Context, store chargeonce.ReconStore, p chargeonce.ReconChargesParams) iter.Seq2[chargeonce.Charge, error] {
	return pages(ctx, p, func(ctx context.Context, p chargeonce.ReconChargesParams) ([]chargeonce.Charge, chargeonce.ReconChargesParams, bool, error) {
		page, err := store.ChargesListByReference(ctx, p)
		if err != nil {
			return nil, p, false, fmt.Errorf("recon: reading our charges after %q: %w", p.After, err)
		}
		for _, c := range page {
			if c.ID <= p.After && p.After != "" {
				return nil, p, false, fmt.Errorf("recon: our charges are not in byte order (%q after %q): the database's collation does not order charge ids as the acquirer's ledger does", c.ID, p.After)
			}
			p.After = c.ID
		}
		return page, p, len(page) == p.Limit, nil
	})
}

// refundPages reads our refunds in (charge reference, id) order.
func refundPages(ctx context.Context, store chargeonce.ReconStore, p chargeonce.ReconRefundsParams) iter.Seq2[chargeonce.Refund, error] {
	return pages(ctx, p, func(ctx context.Context, p chargeonce.ReconRefundsParams) ([]chargeonce.Refund, chargeonce.ReconRefundsParams, bool, error) {
		page, err := store.RefundsListByChargeReference(ctx, p)
		if err != nil {
			return nil, p, false, fmt.Errorf("recon: reading our refunds after %q %q: %w", p.AfterCharge, p.AfterID, err)
		}
		for _, rf := range page {
			if rf.ChargeID < p.AfterCharge || (rf.ChargeID == p.AfterCharge && rf.ID <= p.AfterID && p.AfterID != "") {
				return nil, p, false, fmt.Errorf("recon: our refunds are not in byte order (%q %q after %q %q)", rf.ChargeID, rf.ID, p.AfterCharge, p.AfterID)
			}
			p.AfterCharge, p.AfterID = rf.ChargeID, rf.ID
		}
		return page, p, len(page) == p.Limit, nil
	})
}

// opPages reads our captures and cancels of authorizations in charge
// reference order.
func opPages(ctx context.Context, store chargeonce.ReconStore, p chargeonce.ReconOperationsParams) iter.Seq2[chargeonce.ReconOperation, error] {
	return pages(ctx, p, func(ctx context.Context, p chargeonce.ReconOperationsParams) ([]chargeonce.ReconOperation, chargeonce.ReconOperationsParams, bool, error) {
		page, err := store.OperationsListByChargeReference(ctx, p)
		if err != nil {
			return nil, p, false, fmt.Errorf("recon: reading our captures and cancels after %q: %w", p.AfterCharge, err)
		}
		for _, op := range page {
			if op.ChargeID <= p.AfterCharge && p.AfterCharge != "" {
				return nil, p, false, fmt.Errorf("recon: our captures and cancels are not in byte order (%q after %q)", op.ChargeID, p.AfterCharge)
			}
			p.AfterCharge = op.ChargeID
		}
		return page, p, len(page) == p.Limit, nil
	})
}

// ledgerPages reads the acquirer's ledger in reference order.
func ledgerPages(ctx context.Context, ledger chargeonce.Ledger, p chargeonce.LedgerParams) iter.Seq2[chargeonce.LedgerEntry, error] {
	var (
		last    string
		started bool
	)
	return pages(ctx, p, func(ctx context.Context, p chargeonce.LedgerParams) ([]chargeonce.LedgerEntry, chargeonce.LedgerParams, bool, error) {
		page, err := ledger.LedgerList(ctx, p)
		if err != nil {
			return nil, p, false, fmt.Errorf("recon: reading the acquirer's ledger after %q: %w", p.After, err)
		}
		for _, e := range page.Entries {
			if started && cmp.Less(e.ChargeReference, last) {
				return nil, p, false, fmt.Errorf("recon: the acquirer's ledger is not in reference order (%q after %q)", e.ChargeReference, last)
			}
			last, started = e.ChargeReference, true
		}
		if page.Next != "" && (page.Next == p.After || len(page.Entries) == 0) {
			// A ledger whose cursor does not move would be read forever.
			return nil, p, false, fmt.Errorf("recon: the acquirer's ledger did not advance past %q", p.After)
		}
		p.After = page.Next
		return page.Entries, p, page.Next != "", nil
	})
}

// head reads a sequence one item ahead: one side of the merge join, in
// the order of its items' charge reference (ref).
type head[T any] struct {
	next func() (T, error, bool)
	ref  func(*T) string
	v    T
	ok   bool // v is the head
	done bool
}

// pull reads seq, ordered by ref, through a head; stop releases it.
func pull[T any](seq iter.Seq2[T, error], ref func(*T) string) (h *head[T], stop func()) {
	next, stop := iter.Pull2(seq)
	return &head[T]{next: next, ref: ref}, stop
}

// peek returns the head, nil at the end of the sequence.
func (h *head[T]) peek() (*T, error) {
	if !h.ok && !h.done {
		v, err, ok := h.next()
		switch {
		case !ok:
			h.done = true
		case err != nil:
			h.done = true
			return nil, err
		default:
			h.v, h.ok = v, true
		}
	}
	if !h.ok {
		return nil, nil
	}
	return &h.v, nil
}

// headRef returns the charge reference at the head; ok is false at the
// end of the sequence.
func (h *head[T]) headRef() (ref string, ok bool, err error) {
	v, err := h.peek()
	if err != nil || v == nil {
		return "", false, err
	}
	return h.ref(v), true, nil
}

// take appends to dst, and takes off the head, the items whose charge
// reference is ref.
func (h *head[T]) take(ref string, dst []T) ([]T, error) {
	for {
		v, err := h.peek()
		if err != nil {
			return dst, err
		}
		if v == nil || h.ref(v) != ref {
			return dst, nil
		}
		dst = append(dst, *v)
		h.ok = false
	}
}

// nextRef returns the least charge reference at the heads of the sides;
// ok is false when every side is at its end.
func nextRef(sides ...interface {
	headRef() (string, bool, error)
}) (ref string, ok bool, err error) {
	for _, s := range sides {
		r, more, err := s.headRef()
		if err != nil {
			return "", false, err
		}
		if more && (!ok || r < ref) {
			ref, ok = r, true
		}
	}
	return ref, ok, nil
}
