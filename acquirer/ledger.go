package acquirer

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/chargeonce/chargeonce"
)

var _ chargeonce.Ledger = (*Simulator)(nil)

// ledger is the simulator's record of every settled capture, authorization,
// capture of an authorization, void and refund, for reconciliation. Entries are
// appended as they settle; a page is read through an index sorted by
// (ChargeReference, seq), rebuilt only when entries were added since the
// last read, so paging through a past day sorts once.
type ledger struct {
	entries []chargeonce.LedgerEntry // seq i+1 is entries[i]
	sorted  []int32                  // indexes into entries, by (ChargeReference, seq)
}

// add appends e, giving it the next sequence number and, when it has none,
// an id from it. s.mu must be held.
func (l *ledger) add(e chargeonce.LedgerEntry) {
	seq := len(l.entries) + 1
	if e.ID == "" {
		e.ID = fmt.Sprintf("%s_%08d", kindPrefix(e.Kind), seq)
	}
	if e.ChargeReference == "" {
		e.ChargeReference = e.Reference
	}
	if e.ChargeReference == "" {
		e.ChargeReference = e.MetaReference() // no reference: filed under our id
	}
	l.entries = append(l.entries, e)
}

func kindPrefix(k chargeonce.LedgerKind) string {
	switch k {
	case chargeonce.LedgerRefund:
		return "lre"
	case chargeonce.LedgerVoid:
		return "lvo"
	case chargeonce.LedgerAuthorization:
		return "lau"
	case chargeonce.LedgerManualCapture:
		return "lmc"
	}
	return "lca"
}

// addCapture records a settled capture: captured or declined, or, for an
// authorization, authorized (an entry of its own kind: held, not taken).
// s.mu must be held.
func (l *ledger) addCapture(c *Capture) {
	kind := chargeonce.LedgerCapture
	if c.Status == chargeonce.StatusAuthorized {
		kind = chargeonce.LedgerAuthorization
	}
	l.add(chargeonce.LedgerEntry{
		Kind:        kind,
		Reference:   c.Reference,
		Merchant:    c.Merchant,
		OrderID:     c.OrderID,
		AmountCents: c.AmountCents,
		Currency:    c.Currency,
		Status:      string(c.Status),
		CreatedAt:   c.CreatedAt,
	})
}

// addOperation records a capture (of op.AmountCents) or a void of the
// authorization auth that succeeded: filed under the charge's reference,
// the join key, with the operation's own reference. s.mu must be held.
func (l *ledger) addOperation(op *Operation, auth *Capture) {
	kind, currency := chargeonce.LedgerManualCapture, op.Currency
	if op.Kind == chargeonce.LedgerVoid {
		// A void releases the whole authorization, in its currency.
		kind, currency = chargeonce.LedgerVoid, auth.Currency
	}
	l.add(chargeonce.LedgerEntry{
		Kind: kind, Reference: op.Reference, ChargeReference: op.ChargeReference,
		Merchant: op.Merchant, OrderID: auth.OrderID, AmountCents: op.AmountCents,
		Currency: currency, Status: string(op.Status), CreatedAt: op.CreatedAt,
	})
}

// index returns the entries' indexes sorted by (ChargeReference, seq).
func (l *ledger) index() []int32 {
	if len(l.sorted) == len(l.entries) {
		return l.sorted
	}
	idx := make([]int32, len(l.entries))
	for i := range idx {
		idx[i] = int32(i)
	}
	slices.SortFunc(idx, func(a, b int32) int {
		return cmp.Or(strings.Compare(l.entries[a].ChargeReference, l.entries[b].ChargeReference), cmp.Compare(a, b))
	})
	l.sorted = idx
	return idx
}

// ledgerCursor names one entry of the order: its ChargeReference and its
// sequence number, "REF SEQ" (references hold no spaces).
func ledgerCursor(ref string, i int32) string {
	return ref + " " + strconv.Itoa(int(i)+1)
}

func parseLedgerCursor(s string) (ref string, i int32, err error) {
	ref, seq, ok := strings.Cut(s, " ")
	n, perr := strconv.ParseInt(seq, 10, 32)
	if !ok || ref == "" || perr != nil || n < 1 {
		return "", 0, chargeonce.FieldError("starting_after", "starting_after must be a cursor from a ledger page's next; got %q", s)
	}
	return ref, int32(n - 1), nil
}

// Limits of a ledger page (GET /v1/ledger).
const (
	LedgerDefaultLimit = chargeonce.ReconDefaultPage
	LedgerMaxLimit     = chargeonce.ReconMaxPage
)

// CheckLedgerParams refuses a page request that makes no sense, with an
// EINVALID error naming the field; a zero Limit is LedgerDefaultLimit.
func CheckLedgerParams(p *chargeonce.LedgerParams) error {
	if p.Limit == 0 {
		p.Limit = LedgerDefaultLimit
	}
	if p.Limit < 1 || p.Limit > LedgerMaxLimit {
		return chargeonce.FieldError("limit", "limit must be 1 to %d; got %d", LedgerMaxLimit, p.Limit)
	}
	if p.From.IsZero() || p.To.IsZero() || !p.From.Before(p.To) {
		return chargeonce.FieldError("from", "from and to are required, and from must be before to")
	}
	if p.After != "" {
		if _, _, err := parseLedgerCursor(p.After); err != nil {
			return err
		}
	}
	return nil
}

// LedgerList implements chargeonce.Ledger: one page of the entries created
// in [p.From, p.To), ordered by charge reference and then by the order they
// settled, so that a reference captured twice (after its idempotency
// window) shows both captures side by side. Declined captures are entries
// too. It moves no money.
func (s *Simulator) LedgerList(ctx context.Context, p chargeonce.LedgerParams) (chargeonce.LedgerPage, error) {
	if err := CheckLedgerParams(&p); err != nil {
		return chargeonce.LedgerPage{}, err
	}
	if err := ctx.Err(); err != nil {
		return chargeonce.LedgerPage{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	l := &s.ledger
	idx := l.index()
	start := 0
	if p.After != "" {
		ref, i, _ := parseLedgerCursor(p.After)
		start, _ = slices.BinarySearchFunc(idx, struct {
			ref string
			i   int32
		}{ref, i}, func(e int32, t struct {
			ref string
			i   int32
		}) int {
			return cmp.Or(strings.Compare(l.entries[e].ChargeReference, t.ref), cmp.Compare(e, t.i))
		})
		// start is the cursor's own entry (or where it would be): skip it.
		if start < len(idx) && idx[start] == i && l.entries[i].ChargeReference == ref {
			start++
		}
	}
	page := chargeonce.LedgerPage{Entries: make([]chargeonce.LedgerEntry, 0, min(p.Limit, 64))}
	last := int32(-1) // the last entry on the page
	for k := start; k < len(idx); k++ {
		e := l.entries[idx[k]]
		if e.CreatedAt.Before(p.From) || !e.CreatedAt.Before(p.To) {
			continue
		}
		if len(page.Entries) == p.Limit {
			page.Next = ledgerCursor(l.entries[last].ChargeReference, last)
			break
		}
		page.Entries = append(page.Entries, e)
		last = idx[k]
	}
	return page, nil
}

// LedgerAdd appends an entry to the ledger as if the acquirer had made it:
// tests use it to put money the simulator's API cannot (a refund larger
// than its capture) in front of reconciliation. A zero CreatedAt is now.
func (s *Simulator) LedgerAdd(e chargeonce.LedgerEntry) {
	if e.CreatedAt.IsZero() {
		e.CreatedAt = time.Now().UTC()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ledger.add(e)
}

// ledger serves GET /v1/ledger?from=RFC3339&to=RFC3339&starting_after=C&limit=N.
func (h *handler) ledger(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var p chargeonce.LedgerParams
	var err error
	if p.From, err = time.Parse(time.RFC3339Nano, q.Get("from")); err != nil {
		writeError(w, chargeonce.FieldError("from", "from must be an RFC 3339 time; got %q", q.Get("from")))
		return
	}
	if p.To, err = time.Parse(time.RFC3339Nano, q.Get("to")); err != nil {
		writeError(w, chargeonce.FieldError("to", "to must be an RFC 3339 time; got %q", q.Get("to")))
		return
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			writeError(w, chargeonce.FieldError("limit", "limit must be 1 to %d; got %q", LedgerMaxLimit, v))
			return
		}
		p.Limit = n
	}
	p.After = q.Get("starting_after")
	page, err := h.sim.LedgerList(r.Context(), p)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, page)
}

var _ chargeonce.Ledger = (*Client)(nil)

// LedgerList implements chargeonce.Ledger over GET /v1/ledger.
func (c *Client) LedgerList(ctx context.Context, p chargeonce.LedgerParams) (chargeonce.LedgerPage, error) {
	q := url.Values{
		"from": {p.From.UTC().Format(time.RFC3339Nano)},
		"to":   {p.To.UTC().Format(time.RFC3339Nano)},
	}
	if p.After != "" {
		q.Set("starting_after", p.After)
	}
	if p.Limit != 0 {
		q.Set("limit", strconv.Itoa(p.Limit))
	}
	hreq, err := c.newGet(ctx, "/v1/ledger?"+q.Encode())
	if err != nil {
		return chargeonce.LedgerPage{}, err
	}
	var page chargeonce.LedgerPage
	if err := c.do(hreq, &page); err != nil {
		return chargeonce.LedgerPage{}, fmt.Errorf("acquirer: listing the ledger: %w", err)
	}
	return page, nil
}
