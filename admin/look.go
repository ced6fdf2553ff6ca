package admin

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/chargeonce/chargeonce"
)

// AcquirerView is what the acquirer says about a charge now, in plain
// words, for the operator to read before choosing an outcome.
type AcquirerView struct {
	// Kind is captured, authorized (a manual charge's authorization),
	// declined, never-seen, open, unsure or failed.
	Kind string
	// Plain is the answer in a sentence.
	Plain string
	// Raw is the lookup's own words (the adapter's reason, the error).
	Raw string
	// seen and found are the answer as the rule every kind shares reads
	// it (chargeonce.Judge): what landed, and a found outcome's status.
	seen  chargeonce.Seen
	found string
}

// judged adds to v what the rule reads of the lookup's answer: effect says
// a found outcome took effect, found is its status.
func judged(v AcquirerView, lr chargeonce.LookupResult, err error, effect bool, found string) AcquirerView {
	if err == nil {
		v.seen, _ = seenOf(lr, effect, false)
	}
	v.found = found
	return v
}

// needsForce reports whether settling as decided needs force by the rule
// every kind shares (chargeonce.Judge); effect says the decision is that
// the request took effect. A "no" on a reference the acquirer never saw
// does not, here: whether nothing can land any more is known when the
// resolution claims the record, which fences the reference or answers
// when to come back.
func (v AcquirerView) needsForce(effect bool, decision string) bool {
	if v.seen == chargeonce.SeenNever && !effect {
		return false
	}
	return !chargeonce.Judge(chargeonce.Judgement{Effect: effect, Seen: v.seen, Matches: v.found == decision}).Settle
}

// Says reports whether the acquirer's answer is kind.
func (v AcquirerView) Says(kind string) bool { return v.Kind == kind }

// Warning says, for decision, what the operator must know before
// confirming: empty when the acquirer agrees. The loudest case first: the
// acquirer never saw the reference, and the decision says money moved.
func (v AcquirerView) Warning(decision chargeonce.Status) string {
	switch {
	case v.Kind == "never-seen" && decision == chargeonce.StatusCaptured:
		return "The acquirer says it never saw this charge: by its account no money moved. Settling it as captured tells the merchant it was paid, and they will ship. Do it only if the acquirer's support confirmed a capture under another reference."
	case v.Kind == "captured" && decision == chargeonce.StatusDeclined:
		return "The acquirer says this charge was captured: the money moved. Declining it tells the merchant it was not paid while the customer was charged; the way back is a refund, not a decline."
	case v.Kind == "never-seen" && decision == chargeonce.StatusAuthorized:
		return "The acquirer says it never saw this charge: by its account nothing is held on the card. Settling it as authorized tells the merchant they may capture it, and the capture would fail. Do it only if the acquirer's support confirmed the authorization under another reference."
	case v.Kind == "authorized" && decision == chargeonce.StatusDeclined:
		return "The acquirer says it authorized this charge: the amount is held on the customer's card. Declining it tells the merchant it failed while the hold stays; settle it authorized, then cancel it, to release the hold."
	case v.Kind == "declined" && decision == chargeonce.StatusCaptured:
		return "The acquirer says this charge was declined: no money moved. Settling it as captured tells the merchant it was paid."
	case v.Kind == "declined" && decision == chargeonce.StatusAuthorized:
		return "The acquirer says this charge was declined: nothing is held on the card. Settling it as authorized tells the merchant they may capture it."
	case v.Kind == "open" && decision == chargeonce.StatusDeclined:
		return "The acquirer's payment may still move money; it cannot be declined."
	case v.Kind == "unsure" || v.Kind == "failed":
		return "The acquirer could not say what happened. Settling now goes against no answer at all: only with its support's confirmation."
	}
	return ""
}

// Contradicts reports whether resolving a charge as decision needs force.
func (v AcquirerView) Contradicts(decision chargeonce.Status) bool {
	return v.needsForce(decision != chargeonce.StatusDeclined, string(decision))
}

// plainLookup puts a lookup's answer in plain words.
func plainLookup(lr chargeonce.LookupResult, err error) AcquirerView {
	return judged(plainLookupWords(lr, err), lr, err, lr.Result.Status != chargeonce.StatusDeclined, string(lr.Result.Status))
}

func plainLookupWords(lr chargeonce.LookupResult, err error) AcquirerView {
	raw := describeLookup(lr, err)
	switch {
	case err != nil:
		return AcquirerView{Kind: "failed", Plain: "The acquirer could not be asked: nothing is known about this charge.", Raw: raw}
	case lr.Status == chargeonce.LookupFound && lr.Result.Status == chargeonce.StatusCaptured:
		return AcquirerView{Kind: "captured", Plain: "The acquirer captured this charge: the money moved.", Raw: raw}
	case lr.Status == chargeonce.LookupFound && lr.Result.Status == chargeonce.StatusAuthorized:
		return AcquirerView{Kind: "authorized", Plain: "The acquirer authorized this charge: the amount is held on the card, and nothing was captured.", Raw: raw}
	case lr.Status == chargeonce.LookupFound:
		code := ""
		if lr.Result.DeclineCode != "" {
			code = " (" + lr.Result.DeclineCode + ")"
		}
		return AcquirerView{Kind: "declined", Plain: "The acquirer declined this charge" + code + ": no money moved.", Raw: raw}
	case lr.Status == chargeonce.LookupSafeToSend:
		return AcquirerView{Kind: "never-seen", Plain: "The acquirer never saw this charge: by its account, no money moved.", Raw: raw}
	case lr.Open():
		return AcquirerView{Kind: "open", Plain: "The acquirer holds a payment for this charge that may still move money (under way, or awaiting capture).", Raw: raw}
	}
	return AcquirerView{Kind: "unsure", Plain: "The acquirer cannot tell yet what happened to this charge; ask again later.", Raw: raw}
}

// lookUp asks the acquirer, without claiming anything, what happened to a
// processing charge.
func (s *Server) lookUp(ctx context.Context, ch chargeonce.Charge) AcquirerView {
	rec, err := s.store.KeyGet(ctx, ch.MerchantID, ch.IdempotencyKey)
	if err != nil {
		return AcquirerView{Kind: "failed", Plain: "The charge's record could not be read, so the acquirer was not asked.", Raw: err.Error()}
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.AcquirerTimeout)
	defer cancel()
	lr, lerr := s.acquirer.Lookup(actx, rec.LookupRequest(chargeonce.LookupToResolve))
	return plainLookup(lr, lerr)
}

// lookView is the page where the operator reads the acquirer's answer and
// then chooses an outcome, none preselected.
type lookView struct {
	In       chargeonce.ChargeInspection
	Acquirer AcquirerView
}

// lookPage asks the acquirer first, then offers the resolve form (a POST:
// it calls the acquirer, and no prefetch should).
func (s *Server) lookPage(w http.ResponseWriter, r *http.Request, ss *session) error {
	id := r.PathValue("id")
	in, err := s.ops.ChargeInspect(r.Context(), id)
	if err != nil {
		return err
	}
	if in.Charge.Status != chargeonce.StatusProcessing {
		return chargeonce.Errorf(chargeonce.ENOTPROCESSING, "charge %s is %s already; nothing to resolve", id, in.Charge.Status)
	}
	v := s.lookUp(r.Context(), in.Charge)
	s.log.Info("acquirer looked up by an operator", "admin", ss.admin, "charge_id", id, "acquirer", v.Raw)
	s.render(w, r, http.StatusOK, "look", view{Title: "What the acquirer says", Admin: ss.admin, CSRF: ss.csrf,
		Data: lookView{In: in, Acquirer: v}})
	return nil
}

// Human says what a history entry's outcome means, in words an operator
// reads at a glance; the raw outcome stays one click away.
func Human(e chargeonce.HistoryEntry) string {
	raw := strings.ToLower(e.Outcome + " " + e.Detail)
	switch {
	case strings.Contains(raw, "connection refused"), strings.Contains(raw, "no such host"),
		strings.Contains(raw, "dial tcp"), strings.Contains(raw, "network is unreachable"):
		return "the acquirer could not be reached"
	case strings.Contains(raw, "timeout"), strings.Contains(raw, "deadline exceeded"):
		return "the acquirer did not answer in time"
	case strings.Contains(raw, "unsure"):
		return "the acquirer could not tell what happened"
	case strings.Contains(raw, "safe-to-send"), strings.Contains(raw, "never saw"):
		return "the acquirer never saw it"
	case strings.Contains(raw, "found: captured"):
		return "the acquirer says captured"
	case strings.Contains(raw, "found: authorized"):
		return "the acquirer says authorized"
	case strings.Contains(raw, "found: declined"):
		return "the acquirer says declined"
	case strings.Contains(raw, "error"):
		return "the acquirer answered with an error"
	}
	if e.Outcome == "" {
		return string(e.Kind)
	}
	return string(e.Kind) + ": " + e.Outcome
}

// TimelineRow is a timeline line, or several identical ones in a row
// collapsed into one: "7 × capture by recovery: error, 05:20:59–05:21:59".
type TimelineRow struct {
	chargeonce.HistoryEntry
	Count int
	Last  time.Time
}

// Collapse merges consecutive entries that say the same thing (kind,
// actor, outcome and detail) into one row with their count and time span.
func Collapse(tl []chargeonce.HistoryEntry) []TimelineRow {
	var out []TimelineRow
	for _, e := range tl {
		if n := len(out); n > 0 {
			p := &out[n-1]
			if p.Kind == e.Kind && p.Actor == e.Actor && p.Outcome == e.Outcome && p.Detail == e.Detail && p.Reason == "" && e.Reason == "" {
				p.Count++
				p.Last = e.At
				continue
			}
		}
		out = append(out, TimelineRow{HistoryEntry: e, Count: 1, Last: e.At})
	}
	return out
}
