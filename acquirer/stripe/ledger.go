package stripe

import (
	"bufio"
	"cmp"
	"container/heap"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	stripego "github.com/stripe/stripe-go/v82"

	"github.com/chargeonce/chargeonce"
)

// Defaults of LedgerOptions.
const (
	// DefaultLedgerListLimit is the page size of Stripe's list calls (its
	// maximum).
	DefaultLedgerListLimit = 100
	// DefaultLedgerChunk is how many entries the ledger sorts in memory
	// before it writes them to a temporary file: about 20 MB of entries.
	DefaultLedgerChunk = 50_000
)

// LedgerOptions configure a Ledger.
type LedgerOptions struct {
	// ListLimit is the limit of each list call; zero is
	// DefaultLedgerListLimit.
	ListLimit int64
	// Chunk bounds the entries held in memory while sorting; zero is
	// DefaultLedgerChunk.
	Chunk int
	// TempDir holds the sorted runs of a large period ("" is os.TempDir).
	TempDir string
}

// Ledger is Stripe's side of reconciliation (chargeonce.Ledger): the
// PaymentIntents and Refunds created in a period, as ledger entries in
// reference order.
//
// Stripe lists objects newest first, not by our reference, so the first
// page of a period lists them all (PaymentIntents, then Refunds, each
// paged with starting_after within created[gte] and created[lt]) and sorts
// them externally: runs of Chunk entries are sorted in memory and written
// to temporary files, then merged a page at a time. Memory holds one chunk
// while listing and one entry per run while merging, never the period. The
// pages that follow continue the merge: a Ledger reads one period at a
// time, front to back, as package recon does; Close removes the files.
//
// Stripe's created is in whole seconds: the period is read from the
// second of From to the second after To's when To is not whole.
type Ledger struct {
	a    *Acquirer
	opts LedgerOptions

	mu  sync.Mutex
	cur *ledgerMerge
}

var _ chargeonce.Ledger = (*Ledger)(nil)

// Ledger returns the acquirer's ledger reader.
func (a *Acquirer) Ledger(opts LedgerOptions) *Ledger {
	if opts.ListLimit == 0 {
		opts.ListLimit = DefaultLedgerListLimit
	}
	if opts.Chunk == 0 {
		opts.Chunk = DefaultLedgerChunk
	}
	return &Ledger{a: a, opts: opts}
}

// Close removes the temporary files of the period being read.
func (l *Ledger) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cur == nil {
		return nil
	}
	err := l.cur.close()
	l.cur = nil
	return err
}

// LedgerList implements chargeonce.Ledger. The first page (After "") of a
// period lists and sorts it; a page after another continues from the cursor
// the previous page returned, and only from it.
func (l *Ledger) LedgerList(ctx context.Context, p chargeonce.LedgerParams) (chargeonce.LedgerPage, error) {
	if p.Limit == 0 {
		p.Limit = chargeonce.ReconDefaultPage
	}
	if p.Limit < 1 || p.Limit > chargeonce.ReconMaxPage {
		return chargeonce.LedgerPage{}, chargeonce.FieldError("limit", "limit must be 1 to %d; got %d", chargeonce.ReconMaxPage, p.Limit)
	}
	if p.From.IsZero() || p.To.IsZero() || !p.From.Before(p.To) {
		return chargeonce.LedgerPage{}, chargeonce.FieldError("from", "from and to are required, and from must be before to")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if p.After == "" {
		if l.cur != nil {
			_ = l.cur.close()
			l.cur = nil
		}
		m, err := l.sort(ctx, p.From, p.To)
		if err != nil {
			return chargeonce.LedgerPage{}, err
		}
		l.cur = m
	} else if l.cur == nil || !l.cur.from.Equal(p.From) || !l.cur.to.Equal(p.To) || l.cur.next != p.After {
		return chargeonce.LedgerPage{}, chargeonce.FieldError("starting_after", "the Stripe ledger is read front to back from its first page; %q is not the cursor of the last page it returned", p.After)
	}
	page := chargeonce.LedgerPage{Entries: make([]chargeonce.LedgerEntry, 0, min(p.Limit, 64))}
	for len(page.Entries) < p.Limit {
		e, ok, err := l.cur.pop()
		if err != nil {
			return chargeonce.LedgerPage{}, err
		}
		if !ok {
			_ = l.cur.close()
			l.cur = nil
			return page, nil
		}
		page.Entries = append(page.Entries, e)
	}
	if l.cur.more() {
		l.cur.seq++
		l.cur.next = "page " + strconv.Itoa(l.cur.seq)
		page.Next = l.cur.next
	} else {
		_ = l.cur.close()
		l.cur = nil
	}
	return page, nil
}

// entryCompare is the ledger's order: by charge reference, then by
// creation, then (Stripe's created is in seconds) a charge's first drive
// before its settlement and its refunds, then by id.
func entryCompare(a, b *chargeonce.LedgerEntry) int {
	return cmp.Or(strings.Compare(a.ChargeReference, b.ChargeReference), a.CreatedAt.Compare(b.CreatedAt),
		cmp.Compare(kindRank(a.Kind), kindRank(b.Kind)), strings.Compare(a.ID, b.ID))
}

func kindRank(k chargeonce.LedgerKind) int {
	switch k {
	case chargeonce.LedgerCapture, chargeonce.LedgerAuthorization:
		return 0
	case chargeonce.LedgerManualCapture, chargeonce.LedgerVoid:
		return 1
	}
	return 2
}

// sort lists the period and returns the merge of its sorted runs.
func (l *Ledger) sort(ctx context.Context, from, to time.Time) (*ledgerMerge, error) {
	m := &ledgerMerge{from: from, to: to}
	chunk := make([]chargeonce.LedgerEntry, 0, min(l.opts.Chunk, 4096))
	flush := func() error {
		slices.SortFunc(chunk, func(a, b chargeonce.LedgerEntry) int { return entryCompare(&a, &b) })
		f, err := os.CreateTemp(l.opts.TempDir, "chargeonce-stripe-ledger-*")
		if err != nil {
			return fmt.Errorf("stripe: ledger: %w", err)
		}
		m.files = append(m.files, f)
		w := bufio.NewWriter(f)
		enc := json.NewEncoder(w)
		for i := range chunk {
			if err := enc.Encode(&chunk[i]); err != nil {
				return fmt.Errorf("stripe: ledger: writing a sorted run: %w", err)
			}
		}
		if err := w.Flush(); err != nil {
			return fmt.Errorf("stripe: ledger: writing a sorted run: %w", err)
		}
		chunk = chunk[:0]
		return nil
	}
	add := func(e chargeonce.LedgerEntry) error {
		chunk = append(chunk, e)
		if len(chunk) == l.opts.Chunk {
			return flush()
		}
		return nil
	}
	gte, lt := from.Unix(), to.Unix()
	if to.Truncate(time.Second).Before(to) {
		lt++
	}
	limit := l.opts.ListLimit
	pis := &stripego.PaymentIntentListParams{CreatedRange: &stripego.RangeQueryParams{GreaterThanOrEqual: gte, LesserThan: lt}}
	pis.Limit = &limit
	pis.AddExpand("data.latest_charge") // whether a canceled authorization had held money (a void) or never had (a decline)
	for pi, err := range l.a.sc.V1PaymentIntents.List(ctx, pis) {
		if err != nil {
			m.close()
			return nil, fmt.Errorf("stripe: listing PaymentIntents created in [%d, %d): %w", gte, lt, err)
		}
		for _, e := range PaymentIntentEntries(pi) {
			if err := add(e); err != nil {
				m.close()
				return nil, err
			}
		}
	}
	res := &stripego.RefundListParams{CreatedRange: &stripego.RangeQueryParams{GreaterThanOrEqual: gte, LesserThan: lt}}
	res.Limit = &limit
	res.AddExpand("data.payment_intent") // the charge's reference is in its PaymentIntent's metadata
	for re, err := range l.a.sc.V1Refunds.List(ctx, res) {
		if err != nil {
			m.close()
			return nil, fmt.Errorf("stripe: listing Refunds created in [%d, %d): %w", gte, lt, err)
		}
		if err := add(RefundEntry(re)); err != nil {
			m.close()
			return nil, err
		}
	}
	if len(m.files) == 0 {
		// A small period: one run, kept in memory.
		slices.SortFunc(chunk, func(a, b chargeonce.LedgerEntry) int { return entryCompare(&a, &b) })
		m.mem = chunk
		return m, nil
	}
	if len(chunk) > 0 {
		if err := flush(); err != nil {
			m.close()
			return nil, err
		}
	}
	if err := m.open(); err != nil {
		m.close()
		return nil, err
	}
	return m, nil
}

// PaymentIntentEntries maps a PaymentIntent to its ledger entries, all
// under the chargeonce_reference in its metadata (the charge's reference):
//
//   - automatic capture: one capture entry, captured when it succeeded,
//     declined when it was canceled or needs another payment method, and
//     Stripe's own status otherwise (processing, requires_action);
//   - manual capture (capture_method manual): requires_capture is an
//     authorization entry (authorized, the amount held); succeeded is the
//     authorization and its capture (manual_capture, succeeded, for
//     amount_received, the id its charge's); canceled after it held money
//     (its latest charge succeeded, uncaptured) is the authorization and
//     its void (void, succeeded, at canceled_at); canceled or declined
//     before it held any is a declined capture entry, as for automatic
//     capture.
//
// Stripe captures and cancels the PaymentIntent itself, so the capture's
// and the void's entries carry no reference of their own (Reference ""):
// reconciliation joins them by the charge's. A capture's time is not on
// the PaymentIntent: its entry is dated by the PaymentIntent's creation.
func PaymentIntentEntries(pi *stripego.PaymentIntent) []chargeonce.LedgerEntry {
	order, _ := strconv.ParseInt(pi.Metadata[MetaOrderID], 10, 64)
	ref := pi.Metadata[MetaReference]
	e := chargeonce.LedgerEntry{
		ID: pi.ID, Kind: chargeonce.LedgerCapture, Reference: ref, ChargeReference: ref,
		Merchant: pi.Metadata[MetaMerchant], OrderID: order,
		AmountCents: pi.Amount, Currency: strings.ToUpper(string(pi.Currency)), Status: string(pi.Status),
		CreatedAt: time.Unix(pi.Created, 0).UTC(), Metadata: pi.Metadata,
	}
	held := pi.LatestCharge != nil && pi.LatestCharge.Status == stripego.ChargeStatusSucceeded
	if pi.CaptureMethod == stripego.PaymentIntentCaptureMethodManual || pi.Status == stripego.PaymentIntentStatusRequiresCapture {
		auth := e
		auth.Kind, auth.Status = chargeonce.LedgerAuthorization, string(chargeonce.StatusAuthorized)
		settled := e
		settled.Reference, settled.Status = "", string(chargeonce.OperationSucceeded)
		switch {
		case pi.Status == stripego.PaymentIntentStatusRequiresCapture:
			return []chargeonce.LedgerEntry{auth}
		case pi.Status == stripego.PaymentIntentStatusSucceeded:
			settled.Kind, settled.AmountCents = chargeonce.LedgerManualCapture, pi.AmountReceived
			if pi.LatestCharge != nil && pi.LatestCharge.ID != "" {
				settled.ID = pi.LatestCharge.ID
			}
			return []chargeonce.LedgerEntry{auth, settled}
		case pi.Status == stripego.PaymentIntentStatusCanceled && held:
			settled.Kind = chargeonce.LedgerVoid
			if pi.CanceledAt > 0 {
				settled.CreatedAt = time.Unix(pi.CanceledAt, 0).UTC()
			}
			return []chargeonce.LedgerEntry{auth, settled}
		}
	}
	switch pi.Status {
	case stripego.PaymentIntentStatusSucceeded:
		e.Status = string(chargeonce.StatusCaptured)
	case stripego.PaymentIntentStatusCanceled, stripego.PaymentIntentStatusRequiresPaymentMethod:
		e.Status = string(chargeonce.StatusDeclined)
	}
	return []chargeonce.LedgerEntry{e}
}

// RefundEntry maps a Refund to a refund entry: its reference is the
// chargeonce_reference in its own metadata (the refund's id), its charge's
// the one in its PaymentIntent's (expanded); its status is Stripe's
// (succeeded, pending, failed, canceled, requires_action).
func RefundEntry(re *stripego.Refund) chargeonce.LedgerEntry {
	e := chargeonce.LedgerEntry{
		ID: re.ID, Kind: chargeonce.LedgerRefund, Reference: re.Metadata[MetaReference],
		AmountCents: re.Amount, Currency: strings.ToUpper(string(re.Currency)), Status: string(re.Status),
		CreatedAt: time.Unix(re.Created, 0).UTC(), Metadata: re.Metadata,
	}
	if pi := re.PaymentIntent; pi != nil {
		e.ChargeReference, e.Merchant = pi.Metadata[MetaReference], pi.Metadata[MetaMerchant]
		e.OrderID, _ = strconv.ParseInt(pi.Metadata[MetaOrderID], 10, 64)
	}
	return e
}

// ledgerMerge is one period being read: its sorted runs (in memory for a
// small period, in files otherwise) merged a page at a time.
type ledgerMerge struct {
	from, to time.Time
	next     string // the cursor of the last page returned
	seq      int

	mem   []chargeonce.LedgerEntry
	files []*os.File
	h     mergeHeap
}

type mergeHead struct {
	e   chargeonce.LedgerEntry
	dec *json.Decoder
}

type mergeHeap []*mergeHead

func (h mergeHeap) Len() int           { return len(h) }
func (h mergeHeap) Less(i, j int) bool { return entryCompare(&h[i].e, &h[j].e) < 0 }
func (h mergeHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *mergeHeap) Push(x any)        { *h = append(*h, x.(*mergeHead)) }
func (h *mergeHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

func (m *ledgerMerge) open() error {
	for _, f := range m.files {
		if _, err := f.Seek(0, 0); err != nil {
			return fmt.Errorf("stripe: ledger: %w", err)
		}
		hd := &mergeHead{dec: json.NewDecoder(bufio.NewReader(f))}
		if err := hd.dec.Decode(&hd.e); err != nil {
			return fmt.Errorf("stripe: ledger: reading a sorted run: %w", err)
		}
		m.h = append(m.h, hd)
	}
	heap.Init(&m.h)
	return nil
}

func (m *ledgerMerge) more() bool { return len(m.mem) > 0 || len(m.h) > 0 }

// pop returns the next entry of the merge.
func (m *ledgerMerge) pop() (chargeonce.LedgerEntry, bool, error) {
	if m.files == nil {
		if len(m.mem) == 0 {
			return chargeonce.LedgerEntry{}, false, nil
		}
		e := m.mem[0]
		m.mem = m.mem[1:]
		return e, true, nil
	}
	if len(m.h) == 0 {
		return chargeonce.LedgerEntry{}, false, nil
	}
	hd := m.h[0]
	e := hd.e
	hd.e = chargeonce.LedgerEntry{}
	switch err := hd.dec.Decode(&hd.e); {
	case errors.Is(err, io.EOF):
		heap.Pop(&m.h)
	case err != nil:
		return chargeonce.LedgerEntry{}, false, fmt.Errorf("stripe: ledger: reading a sorted run: %w", err)
	default:
		heap.Fix(&m.h, 0)
	}
	return e, true, nil
}

func (m *ledgerMerge) close() error {
	var errs []error
	for _, f := range m.files {
		errs = append(errs, f.Close(), os.Remove(f.Name()))
	}
	m.files, m.mem, m.h = nil, nil, nil
	return errors.Join(errs...)
}
