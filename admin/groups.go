package admin

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/chargeonce/chargeonce"
)

// Group is the stuck charges that share a cause (their last outcome in
// human words), for working an outage a group at a time.
type Group struct {
	// Kind is what the group's operations are: "charge" or "refund".
	Kind   string
	Cause  string
	Count  int
	Totals []string // the amounts, summed per currency
	Oldest time.Duration
}

// cause is what holds a stuck charge, in human words.
func cause(c *chargeonce.StuckCharge) string {
	if c.Refund != nil && c.Last == nil {
		// Refunds append no trail: only an operator's refusal is kept.
		return "refund sent, outcome unknown"
	}
	if c.Operation != nil && c.Last == nil {
		// Nor do captures and cancels of authorizations.
		if c.Operation.Kind == chargeonce.KindCancel {
			return "void sent, outcome unknown"
		}
		return "capture sent, outcome unknown"
	}
	if c.Last == nil || (c.Last.Kind == chargeonce.HistoryRecoveryClaim && !c.InFlight) {
		// No entry at all: the attempt that inserted it died mid-call. A
		// claim last: the drive that claimed it died mid-call (the
		// engine appends a claim before it calls the acquirer).
		return "capture sent, no answer stored"
	}
	if c.InFlight {
		return "in flight: the acquirer's answer may still come"
	}
	return Human(*c.Last)
}

// Groups groups stuck charges by cause, the largest group first.
func Groups(cs []chargeonce.StuckCharge) []Group {
	byCause := map[string]*Group{}
	sums := map[string]map[string]int64{}
	var order []string
	for i := range cs {
		c := &cs[i]
		k := kindName(c.Kind()) + " " + cause(c)
		g := byCause[k]
		if g == nil {
			g = &Group{Kind: kindName(c.Kind()), Cause: cause(c)}
			byCause[k] = g
			sums[k] = map[string]int64{}
			order = append(order, k)
		}
		g.Count++
		g.Oldest = max(g.Oldest, c.Age)
		switch {
		case c.Operation != nil:
			sums[k][c.Operation.Currency] += c.Operation.AmountCents
		case c.Refund != nil:
			sums[k][c.Refund.Currency] += c.Refund.AmountCents
		default:
			sums[k][c.Charge.Currency] += c.Charge.AmountCents
		}
	}
	out := make([]Group, 0, len(order))
	for _, k := range order {
		g := byCause[k]
		currencies := make([]string, 0, len(sums[k]))
		for cur := range sums[k] {
			currencies = append(currencies, cur)
		}
		slices.Sort(currencies)
		for _, cur := range currencies {
			g.Totals = append(g.Totals, chargeonce.FormatAmount(sums[k][cur], cur))
		}
		out = append(out, *g)
	}
	slices.SortStableFunc(out, func(a, b Group) int { return b.Count - a.Count })
	return out
}

// BulkOutcome is what the bulk action did with one charge, refund,
// capture or cancel.
type BulkOutcome struct {
	Kind     string
	ID       string
	ChargeID string
	Amount   string
	Acquirer AcquirerView
	Settled  string // the status it was settled as, or ""
	Note     string // why not, or the refusal
}

// bulkSettle is "look up all and settle those the acquirer answers" for
// the stuck charges of one cause: each is looked up, and one the acquirer
// answers (captured, authorized, or declined) is resolved as it says, through
// Resolve: the same claim, lookup, rules and one audit entry per charge as
// a single resolution. Charges the acquirer cannot answer for, or never
// saw (recovery sends those again), are left as they are.
func (s *Server) bulkSettle(w http.ResponseWriter, r *http.Request, ss *session) error {
	want, wantKind := r.PostFormValue("cause"), r.PostFormValue("kind")
	if wantKind == "" {
		wantKind = kindName(chargeonce.KindCharge)
	}
	reason := strings.TrimSpace(r.PostFormValue("reason"))
	if strings.TrimSpace(reason) == "" {
		return chargeonce.FieldError("reason", "reason is required: say why (the outage, the ticket)")
	}
	page, err := s.ops.ChargesListStuck(r.Context(), chargeonce.StuckListParams{Limit: chargeonce.StuckListMaxLimit})
	if err != nil {
		return err
	}
	var out []BulkOutcome
	for i := range page.Charges {
		c := &page.Charges[i]
		if cause(c) != want || kindName(c.Kind()) != wantKind {
			continue
		}
		if c.Refund != nil {
			out = append(out, s.bulkSettleRefund(r, ss, c, reason))
			continue
		}
		if c.Operation != nil {
			out = append(out, s.bulkSettleOperation(r, ss, c, reason))
			continue
		}
		o := BulkOutcome{Kind: wantKind, ID: c.Charge.ID, ChargeID: c.Charge.ID, Amount: chargeonce.FormatAmount(c.Charge.AmountCents, c.Charge.Currency)}
		o.Acquirer = s.lookUp(r.Context(), c.Charge)
		var status chargeonce.Status
		switch o.Acquirer.Kind {
		case "captured":
			status = chargeonce.StatusCaptured
		case "authorized":
			// Only an authorization is found authorized: its charge is
			// manual, and settles so.
			status = chargeonce.StatusAuthorized
		case "declined":
			status = chargeonce.StatusDeclined
		default:
			o.Note = "left for recovery: the acquirer gave no outcome to settle from"
			out = append(out, o)
			continue
		}
		res, err := s.Resolve(r.Context(), ss.admin, c.Charge.ID, ResolveRequest{Status: status, Reason: "bulk: " + reason})
		if err != nil {
			o.Note = "not settled: " + chargeonce.ErrorMessage(err)
		} else {
			o.Settled = string(res.Charge.Status)
		}
		out = append(out, o)
	}
	s.render(w, r, http.StatusOK, "bulk", view{Title: fmt.Sprintf("Looked up: %s (%ss)", want, wantKind), Admin: ss.admin, CSRF: ss.csrf, Data: out})
	return nil
}

// bulkSettleRefund looks one stuck refund up and, when the acquirer gives
// its outcome, resolves it so through ResolveRefund (the same claim,
// second lookup, rules and audit entry as one resolution).
func (s *Server) bulkSettleRefund(r *http.Request, ss *session, c *chargeonce.StuckCharge, reason string) BulkOutcome {
	rf := c.Refund
	o := BulkOutcome{Kind: kindName(chargeonce.KindRefund), ID: rf.ID, ChargeID: rf.ChargeID, Amount: chargeonce.FormatAmount(rf.AmountCents, rf.Currency)}
	_, v, err := s.lookUpRefund(r.Context(), c.Charge.MerchantID, rf.ID)
	if err != nil {
		o.Note = "not looked up: " + chargeonce.ErrorMessage(err)
		return o
	}
	o.Acquirer = v
	var status chargeonce.RefundStatus
	switch v.Kind {
	case "succeeded":
		status = chargeonce.RefundSucceeded
	case "refund-failed":
		status = chargeonce.RefundFailed
	case "canceled":
		status = chargeonce.RefundCanceled
	default:
		o.Note = "left for recovery: the acquirer gave no outcome to settle from"
		return o
	}
	res, err := s.ResolveRefund(r.Context(), ss.admin, rf.ID, RefundResolveRequest{Status: status, Reason: "bulk: " + reason})
	if err != nil {
		o.Note = "not settled: " + chargeonce.ErrorMessage(err)
	} else {
		o.Settled = string(res.Refund.Status)
	}
	return o
}

// bulkSettleOperation looks one stuck capture or cancel up and, when the
// acquirer gives its outcome, resolves it so through ResolveOperation (the
// same claim, second lookup, rules and audit entry as one resolution).
func (s *Server) bulkSettleOperation(r *http.Request, ss *session, c *chargeonce.StuckCharge, reason string) BulkOutcome {
	op := c.Operation
	o := BulkOutcome{Kind: kindName(op.Kind), ID: op.ID, ChargeID: op.ChargeID, Amount: chargeonce.FormatAmount(op.AmountCents, op.Currency)}
	in, err := s.ops.OperationInspect(r.Context(), op.ID)
	if err != nil {
		o.Note = "not looked up: " + chargeonce.ErrorMessage(err)
		return o
	}
	o.Acquirer = s.lookUpOperation(r.Context(), in)
	var status chargeonce.OperationStatus
	switch o.Acquirer.Kind {
	case "succeeded":
		status = chargeonce.OperationSucceeded
	case "op-failed":
		status = chargeonce.OperationFailed
	default:
		o.Note = "left for recovery: the acquirer gave no outcome to settle from"
		return o
	}
	res, err := s.ResolveOperation(r.Context(), ss.admin, op.ID, OperationResolveRequest{Status: status, Reason: "bulk: " + reason})
	if err != nil {
		o.Note = "not settled: " + chargeonce.ErrorMessage(err)
	} else {
		o.Settled = string(res.Operation.Status)
	}
	return o
}
