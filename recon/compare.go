package recon

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/chargeonce/chargeonce"
)

// Comparing one object's two sides.
//
// A charge's capture, a refund, and the capture or void of an
// authorization are compared by one template (compare): where our record
// stands (moved money, did not, does not know yet), what the acquirer's
// entries for it show (seen: it acted; did: it did what ours should
// have; contrary: it moved money against ours), and, when both moved
// money, the amounts, the currency and how many times. What differs by
// kind is the vocabulary: which statuses stand where, which entries count
// as moved, which amounts must agree, and the words of each mismatch.

// standing is where our record of an object stands.
type standing int

const (
	// absent: we have no record of it.
	absent standing = iota
	// moved: we say money moved (captured, refunded, settled).
	moved
	// unmoved: we say no money moved (declined, failed, canceled, or a
	// charge that only authorized).
	unmoved
	// open: we do not know yet (processing, pending).
	open
	// elsewhere: none of these; compared by its amounts alone.
	elsewhere
)

// object is one object's two sides in the comparator's terms.
type object struct {
	// m is the mismatch every difference is reported as: the references,
	// the kind, and both sides as shown.
	m        Mismatch
	standing standing
	// since ages ours for the settlement window.
	since time.Time
	// charge is our charge the object belongs to (nil when we have none):
	// what a kind's amounts check beside the object's own.
	charge *chargeonce.Charge
	// The acquirer's entries for the object: seen shows it acted on it,
	// did the entries of seen that did what ours should have (the first
	// is compared), contrary those that moved money against ours.
	seen, did, contrary []chargeonce.LedgerEntry
}

// vocabulary is what a kind's comparison says and checks. A phrase's
// placeholders: {n} how many entries did it, {age} how old ours is,
// {ours} and {theirs} the statuses shown, {kind} the mismatch's kind,
// {their_amount} the acquirer's amount shown, {our_currency} and
// {their_currency}. A kind whose currency or duplicate is empty does not
// compare it; its other empty phrases are for states its objects never
// reach (an authorization is always unmoved).
type vocabulary struct {
	unknown   string // we have none; the acquirer did it
	young     string // ours moved money, the acquirer shows nothing, within the window
	missing   string // the same past the window
	contrary  string // ours moved money, the acquirer moved it against ours
	unmatched string // ours moved money, the acquirer shows it did not
	undone    string // ours moved none, the acquirer did it
	openSeen  string // ours open, the acquirer shows it, within the window
	stale     string // the same past the window
	openYoung string // ours open, the acquirer shows nothing, within the window
	// amounts says which amounts must agree with what did it first,
	// beside the currency; settledOnly compares them only when ours moved
	// money.
	amounts     amounts
	settledOnly bool
	currency    string
	duplicate   string // it did it more than once
}

// vocabularies are the kinds' vocabularies, by the ledger kind compared.
var vocabularies = map[chargeonce.LedgerKind]*vocabulary{
	// A charge with automatic capture and the acquirer's captures under
	// its reference.
	chargeonce.LedgerCapture: {
		unknown:   "the acquirer captured {n} time(s) under a reference we have no charge for",
		young:     "captured by us {age} ago; the acquirer shows nothing yet",
		missing:   "captured by us; the acquirer has no capture under the reference",
		unmatched: "captured by us, {theirs} at the acquirer",
		undone:    "declined by us, captured by the acquirer",
		openSeen:  "processing with us; the acquirer has settled it {theirs}",
		stale:     "still processing with us past the settlement window; the acquirer has it {theirs}",
		openYoung: "processing with us; the acquirer shows nothing yet",
		amounts:   chargeAmounts,
		currency:  "we recorded {our_currency}, the acquirer captured {their_currency}",
		duplicate: "the acquirer captured {n} times under one reference",
	},
	// A charge with manual capture authorized (and since captured or
	// canceled): it moved no money under its reference; its capture or
	// void is compared on the day it settled.
	chargeonce.LedgerAuthorization: {
		undone:    "authorized by us (manual capture), captured outright by the acquirer",
		duplicate: "the acquirer captured {n} times under one reference",
	},
	// Our refund and the acquirer's under its reference.
	chargeonce.LedgerRefund: {
		unknown:   "the acquirer refunded {n} time(s) under a reference we have no refund for",
		young:     "refunded by us {age} ago; the acquirer shows nothing yet",
		missing:   "refunded by us; the acquirer has no refund under the reference",
		unmatched: "refunded by us, {theirs} at the acquirer",
		undone:    "{ours} with us, {theirs} at the acquirer",
		openSeen:  "pending with us; the acquirer has it {theirs}",
		stale:     "still pending with us past the settlement window; the acquirer has it {theirs}",
		openYoung: "pending with us; the acquirer shows nothing yet",
		amounts:   refundAmount,
		currency:  "we refunded in {our_currency}, the acquirer in {their_currency}",
		duplicate: "the acquirer refunded {n} times under one refund reference",
	},
	// Our capture of an authorization (or none) and the acquirer's
	// captures and voids of it.
	chargeonce.LedgerManualCapture: {
		unknown:     "the acquirer captured the authorization {n} time(s); we recorded no capture of it",
		young:       "captured by us {age} ago; the acquirer shows nothing yet",
		missing:     "captured by us; the acquirer has no capture of the authorization",
		unmatched:   "captured by us, voided by the acquirer",
		openSeen:    "our {kind} is pending; the acquirer has settled the authorization ({theirs})",
		stale:       "our {kind} is still pending past the settlement window; the acquirer has settled the authorization ({theirs})",
		openYoung:   "our {kind} is pending; the acquirer shows nothing yet",
		amounts:     captureAmounts,
		settledOnly: true,
		currency:    "we captured in {our_currency}, the acquirer in {their_currency}",
		duplicate:   "the acquirer captured the authorization {n} times",
	},
	// Our cancel of an authorization and the acquirer's voids and
	// captures of it.
	chargeonce.LedgerVoid: {
		young:       "voided by us {age} ago; the acquirer shows nothing yet",
		missing:     "voided by us; the acquirer has no void of the authorization",
		contrary:    "voided by us, captured ({their_amount} minor units) by the acquirer",
		openSeen:    "our {kind} is pending; the acquirer has settled the authorization ({theirs})",
		stale:       "our {kind} is still pending past the settlement window; the acquirer has settled the authorization ({theirs})",
		openYoung:   "our {kind} is pending; the acquirer shows nothing yet",
		settledOnly: true,
	},
}

// amounts is which amounts of ours must agree with the acquirer's.
type amounts int

const (
	// noAmounts: none (an authorization, a void).
	noAmounts amounts = iota
	// chargeAmounts: the charge's amount, and its captured_cents when set
	// (an automatic charge has none: NULL; one set bounds its refunds).
	chargeAmounts
	// refundAmount: the refund's amount.
	refundAmount
	// captureAmounts: our capture's amount, and what the charge shows
	// captured (captured_cents: what the API answers and what bounds its
	// refunds).
	captureAmounts
)

// compareAmounts reports how the amounts a of ours differ from c's; it
// returns how many mismatches.
func (r *run) compareAmounts(a amounts, o *object, c chargeonce.LedgerEntry) int {
	our, m := o.charge, o.m
	switch {
	case a == noAmounts:
		return 0
	case a == refundAmount && c.AmountCents != o.m.OurAmountCents:
		m.Detail = fmt.Sprintf("we refunded %d, the acquirer %d (minor units)", o.m.OurAmountCents, c.AmountCents)
	case a == chargeAmounts && c.AmountCents != our.AmountCents:
		m.Detail = fmt.Sprintf("we recorded %d, the acquirer captured %d (minor units)", our.AmountCents, c.AmountCents)
	case a == chargeAmounts && our.CapturedCents != 0 && our.CapturedCents != c.AmountCents:
		m.OurAmountCents = our.CapturedCents
		m.Detail = fmt.Sprintf("the charge's captured_cents is %d (it bounds its refunds); the acquirer captured %d (minor units)", our.CapturedCents, c.AmountCents)
	case a == captureAmounts && c.AmountCents != o.m.OurAmountCents:
		shown := ""
		if our != nil && our.AmountCaptured() != o.m.OurAmountCents {
			shown = fmt.Sprintf("; the charge shows %d captured", our.AmountCaptured())
		}
		m.Detail = fmt.Sprintf("we captured %d, the acquirer %d of the authorization (minor units)%s", o.m.OurAmountCents, c.AmountCents, shown)
	case a == captureAmounts && our != nil && our.Status != chargeonce.StatusCaptured:
		m.Type = StatusMismatch
		m.Detail = fmt.Sprintf("our capture %s and the acquirer's (%d) succeeded, but the charge shows %s", m.ObjectReference, c.AmountCents, our.Status)
	case a == captureAmounts && our != nil && our.CapturedCents != c.AmountCents:
		m.OurAmountCents = our.CapturedCents
		m.Detail = fmt.Sprintf("the charge shows %d captured (captured_cents, which bounds its refunds); our capture %s and the acquirer captured %d (minor units)",
			our.CapturedCents, m.ObjectReference, c.AmountCents)
	default:
		return 0
	}
	if m.Type == "" {
		m.Type = AmountMismatch
	}
	r.add(m)
	return 1
}

// compare reports what differs between the object's two sides, in the
// kind's words; it returns how many mismatches.
func (r *run) compare(v *vocabulary, o *object) int {
	found := 0
	say := func(m Mismatch, t Type, phrase string) {
		m.Type, m.Detail = t, r.fill(phrase, o, &m)
		r.add(m)
		found++
	}
	young := o.standing != absent && r.now.Sub(o.since) < r.opts.SettlementWindow
	switch s := o.standing; {
	case s == absent:
		if len(o.did) > 0 {
			say(o.m, MissingInternal, v.unknown)
		}
	case s == moved && len(o.contrary) > 0:
		m, c := o.m, o.contrary[0]
		m.AcquirerStatus, m.AcquirerAmountCents, m.AcquirerCurrency = c.Status, c.AmountCents, c.Currency
		say(m, StatusMismatch, v.contrary)
	case s == moved && len(o.seen) == 0:
		if young {
			say(o.m, Pending, v.young)
		} else {
			say(o.m, MissingAtAcquirer, v.missing)
		}
	case s == moved && len(o.did) == 0:
		say(o.m, StatusMismatch, v.unmatched)
	case s == unmoved && len(o.did) > 0:
		say(o.m, StatusMismatch, v.undone)
	case s == open && len(o.seen) > 0:
		if young {
			say(o.m, Pending, v.openSeen)
		} else {
			say(o.m, StatusMismatch, v.stale)
		}
	case s == open && young:
		say(o.m, Pending, v.openYoung)
	}
	if o.standing == absent || len(o.did) == 0 || (v.settledOnly && o.standing != moved) {
		return found
	}
	c := o.did[0]
	found += r.compareAmounts(v.amounts, o, c)
	if v.currency != "" && !strings.EqualFold(c.Currency, o.m.OurCurrency) {
		say(o.m, CurrencyMismatch, v.currency)
	}
	if v.duplicate != "" && len(o.did) > 1 {
		say(o.m, DuplicateForIntent, v.duplicate)
	}
	return found
}

// fill fills a phrase's placeholders for the object and m, the mismatch
// reported.
func (r *run) fill(phrase string, o *object, m *Mismatch) string {
	if !strings.Contains(phrase, "{") {
		return phrase
	}
	theirCurrency := ""
	if len(o.did) > 0 {
		theirCurrency = o.did[0].Currency
	}
	return strings.NewReplacer(
		"{n}", strconv.Itoa(len(o.did)),
		"{age}", r.now.Sub(o.since).Round(time.Second).String(),
		"{ours}", m.OurStatus, "{theirs}", m.AcquirerStatus, "{kind}", string(m.Kind),
		"{their_amount}", strconv.FormatInt(m.AcquirerAmountCents, 10),
		"{our_currency}", o.m.OurCurrency, "{their_currency}", theirCurrency,
	).Replace(phrase)
}

// theirSide shows the acquirer's side in m: every entry's id, and the
// status, amount and currency of shown (the first that did what ours
// should have, else the first); nil when there is none.
func theirSide(m *Mismatch, entries, did []chargeonce.LedgerEntry) *chargeonce.LedgerEntry {
	for _, e := range entries {
		m.AcquirerIDs = append(m.AcquirerIDs, e.ID)
	}
	if len(entries) == 0 {
		return nil
	}
	shown := &entries[0]
	if len(did) > 0 {
		shown = &did[0]
	}
	m.AcquirerStatus, m.AcquirerAmountCents, m.AcquirerCurrency = shown.Status, shown.AmountCents, shown.Currency
	return shown
}

// ours shows our record in the object's mismatch, and ages it from since.
func (o *object) ours(status string, amount int64, currency string, created, since time.Time) {
	o.m.OurStatus, o.m.OurAmountCents, o.m.OurCurrency, o.m.OurCreatedAt = status, amount, currency, created.UTC()
	o.since = since
}

// joinCapture compares our charge with the acquirer's captures under its
// reference and reports what differs; it returns how many mismatches.
func (r *run) joinCapture(ref string, our *chargeonce.Charge, captures []chargeonce.LedgerEntry, joinedBy string) int {
	o := object{m: Mismatch{Kind: chargeonce.LedgerCapture, Reference: ref, AcquirerIDs: make([]string, 0, len(captures)), JoinedBy: joinedBy}, charge: our, seen: captures}
	for _, e := range captures {
		if e.Status == string(chargeonce.StatusCaptured) {
			o.did = append(o.did, e)
		}
	}
	if our != nil {
		o.m.Merchant, o.m.OrderID = our.MerchantID, our.OrderID
		o.ours(string(our.Status), our.AmountCents, our.Currency, our.CreatedAt, our.CreatedAt)
	}
	if first := theirSide(&o.m, captures, o.did); first != nil && our == nil {
		o.m.Merchant, o.m.OrderID = first.Merchant, first.OrderID
	}
	kind := chargeonce.LedgerCapture
	switch {
	case our == nil:
	case our.CaptureMethod == chargeonce.CaptureManual &&
		(our.Status == chargeonce.StatusAuthorized || our.Status == chargeonce.StatusCaptured || our.Status == chargeonce.StatusCanceled):
		kind, o.standing = chargeonce.LedgerAuthorization, unmoved
	case our.Status == chargeonce.StatusCaptured:
		o.standing = moved
	case our.Status == chargeonce.StatusDeclined:
		o.standing = unmoved
	case our.Status == chargeonce.StatusProcessing:
		o.standing = open
	default:
		o.standing = elsewhere
	}
	return r.compare(vocabularies[kind], &o)
}

// joinRefund compares one refund reference's two sides.
func (r *run) joinRefund(ref, key string, charge *chargeonce.Charge, p *refundPair) int {
	o := object{m: Mismatch{Kind: chargeonce.LedgerRefund, Reference: ref, ObjectReference: key}, charge: charge, seen: p.theirs}
	if charge != nil {
		o.m.OrderID = charge.OrderID
	}
	for _, e := range p.theirs {
		if movesMoney(e) {
			o.did = append(o.did, e)
		}
	}
	if first := theirSide(&o.m, p.theirs, o.did); first != nil {
		o.m.Merchant = first.Merchant
	}
	if ours := p.ours; ours != nil {
		o.m.Merchant = ours.MerchantID
		o.ours(string(ours.Status), ours.AmountCents, ours.Currency, ours.CreatedAt, ours.CreatedAt)
		switch ours.Status {
		case chargeonce.RefundSucceeded:
			o.standing = moved
		case chargeonce.RefundFailed, chargeonce.RefundCanceled:
			o.standing = unmoved
		case chargeonce.RefundPending:
			o.standing = open
		default:
			o.standing = elsewhere
		}
	}
	return r.compare(vocabularies[chargeonce.LedgerRefund], &o)
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
	var settled time.Time
	if ours != nil {
		settled = ours.SettledAt
	}
	if !r.belongs(ours != nil, settled, settlements) {
		return 0, false
	}
	var caps, voids []chargeonce.LedgerEntry
	for _, e := range settlements {
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
	// What the acquirer settled (a failed attempt settles nothing):
	// captures, then voids.
	o := object{m: Mismatch{Reference: ref}, charge: our, seen: append(caps[:len(caps):len(caps)], voids...), did: caps}
	if our != nil {
		o.m.Merchant, o.m.OrderID = our.MerchantID, our.OrderID
	}
	if first := theirSide(&o.m, settlements, o.seen); first != nil {
		o.m.Kind, o.m.ObjectReference = first.Kind, first.Reference
		if our == nil {
			o.m.Merchant, o.m.OrderID = first.Merchant, first.OrderID
		}
	}
	if ours != nil && r.inPeriod(ours.SettledAt) {
		r.report.Operations++
		if ms := r.merchant(ours.MerchantID); ms != nil {
			ms.Operations++
		}
	}
	kind := chargeonce.LedgerManualCapture
	if ours != nil {
		o.m.Kind, o.m.ObjectReference, o.m.Merchant = opKind(ours), ours.ID, ours.MerchantID
		o.ours(string(ours.Status), ours.AmountCents, ours.Currency, ours.CreatedAt, ours.SettledAt)
		o.standing = moved
		if ours.Status == chargeonce.OperationPending {
			o.standing = open
		}
		if ours.Kind == chargeonce.KindCancel {
			// A void did what ours should have; a capture moved money
			// against it.
			kind, o.did, o.contrary = chargeonce.LedgerVoid, voids, caps
		}
	}
	return r.compare(vocabularies[kind], &o), true
}
