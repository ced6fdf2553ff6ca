package admin

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/engine"
)

// DefaultRefundFailure is a failed or canceled refund's failure reason
// when the operator gives none and the acquirer named none.
const DefaultRefundFailure = "operator_failed"

// RefundResolveRequest is an operator's decision about a pending refund.
type RefundResolveRequest struct {
	Status        chargeonce.RefundStatus `json:"status"`
	FailureReason string                  `json:"failure_reason,omitempty"`
	Reason        string                  `json:"reason"`
	Force         bool                    `json:"force,omitempty"`
}

// Check validates the request.
func (q *RefundResolveRequest) Check() error {
	if !q.Status.Final() || !isRefundStatus(q.Status) {
		return chargeonce.FieldError("status", "status must be succeeded, failed or canceled")
	}
	if q.Status == chargeonce.RefundSucceeded && q.FailureReason != "" {
		return chargeonce.FieldError("failure_reason", "a succeeded refund has no failure_reason")
	}
	return checkReasons(q.Reason, q.FailureReason)
}

// checkReasons validates an operator's reason and the failure reason a
// failed refund, capture or cancel is settled with.
func checkReasons(reason, failure string) error {
	if !chargeonce.ValidText(reason) || !chargeonce.ValidText(failure) {
		return chargeonce.FieldError("reason", "reason and failure_reason must be valid UTF-8 without U+0000")
	}
	if strings.TrimSpace(reason) == "" {
		return chargeonce.FieldError("reason", "reason is required: say why (who at the acquirer confirmed what)")
	}
	if n := utf8.RuneCountInString(reason); n > MaxReasonLen {
		return chargeonce.FieldError("reason", "reason must be at most %d characters; got %d", MaxReasonLen, n)
	}
	if len(failure) > 64 {
		return chargeonce.FieldError("failure_reason", "failure_reason must be at most 64 characters")
	}
	return nil
}

func isRefundStatus(s chargeonce.RefundStatus) bool {
	for _, v := range chargeonce.RefundStatuses {
		if s == v {
			return true
		}
	}
	return false
}

// RefundResolution is what a refund's resolution did.
type RefundResolution struct {
	Refund         chargeonce.Refund
	Audit          chargeonce.HistoryEntry
	AcquirerAnswer string
}

// refunder is the acquirer's refund side, or an EUNAVAILABLE error.
func (s *Server) refunder() (chargeonce.Refunder, error) {
	r, ok := s.acquirer.(chargeonce.Refunder)
	if !ok {
		return nil, chargeonce.Errorf(chargeonce.EUNAVAILABLE, "this service's acquirer cannot refund, so it cannot be asked about a refund")
	}
	return r, nil
}

// ResolveRefund settles a pending refund as admin decided, under the rules
// every kind shares (see resolveRecord): the acquirer is asked what became
// of the refund's reference (RefundLookup) before anything is settled, and
// an outcome it holds other than the decision contradicts it. The refund is
// settled by the statement attempts and recovery settle refunds with (a
// failed or canceled refund gives its amount back to the charge). A failed
// or canceled refund's failure reason is the operator's, else the
// acquirer's, else DefaultRefundFailure.
func (s *Server) ResolveRefund(ctx context.Context, admin, refundID string, q RefundResolveRequest) (RefundResolution, error) {
	if err := q.Check(); err != nil {
		return RefundResolution{}, err
	}
	if kindOf(refundID) != chargeonce.KindRefund {
		return RefundResolution{}, chargeonce.Errorf(chargeonce.ENOTFOUND, "refund %q not found", refundID)
	}
	acq, err := s.refunder()
	if err != nil {
		return RefundResolution{}, err
	}
	var final chargeonce.Refund
	res, err := s.resolveRecord(ctx, admin, decision{
		id: refundID, kinds: []chargeonce.RecordKind{chargeonce.KindRefund}, what: "refund",
		wanted: string(q.Status), reason: q.Reason, force: q.Force,
		lookup: func(ctx context.Context, rec *chargeonce.KeyRecord) (chargeonce.LookupResult, error) {
			return acq.RefundLookup(ctx, rec.LookupRequest(chargeonce.LookupToResolve))
		},
		describe: describeRefundLookup,
		effect:   q.Status == chargeonce.RefundSucceeded,
		seen: func(lr chargeonce.LookupResult) (chargeonce.Seen, bool) {
			return seenOf(lr, lr.Refund.Status == chargeonce.RefundSucceeded, lr.Refund.Status == q.Status)
		},
		settle: func(rec *chargeonce.KeyRecord, lr chargeonce.LookupResult, found bool) (chargeonce.KeyCompleteParams, string, string) {
			final = *rec.Refund
			final.Status = q.Status
			if q.Status != chargeonce.RefundSucceeded {
				final.FailureReason = q.FailureReason
				if final.FailureReason == "" && found {
					final.FailureReason = lr.Refund.FailureReason
				}
				if final.FailureReason == "" {
					final.FailureReason = DefaultRefundFailure
				}
			}
			outcome := string(final.Status)
			if final.FailureReason != "" {
				outcome += " (" + final.FailureReason + ")"
			}
			return chargeonce.KeyCompleteParams{
				RefundStatus: final.Status, FailureReason: final.FailureReason,
				ResponseStatus: http.StatusCreated, ResponseBody: engine.EncodeRefund(&final),
			}, outcome, "refund of " + final.ChargeID + "; "
		},
	})
	if err != nil {
		return RefundResolution{AcquirerAnswer: res.answer}, err
	}
	s.log.Warn("refund resolved by an operator", "admin", admin, "refund_id", final.ID, "charge_id", final.ChargeID, "merchant", final.MerchantID,
		"status", final.Status, "failure_reason", final.FailureReason, "forced", res.forced, "acquirer", res.answer)
	return RefundResolution{Refund: final, Audit: res.audit, AcquirerAnswer: res.answer}, nil
}

// describeRefundLookup says in a line what the acquirer answered about a
// refund.
func describeRefundLookup(lr chargeonce.LookupResult, err error) string {
	if err != nil {
		return "lookup failed: " + err.Error()
	}
	s := lr.Status.String()
	if lr.Status == chargeonce.LookupFound {
		s = "found: " + string(lr.Refund.Status)
		if lr.Refund.FailureReason != "" {
			s += " (" + lr.Refund.FailureReason + ")"
		}
	}
	if lr.Reason != "" {
		s += " — " + lr.Reason
	}
	return s
}

// plainRefundLookup puts a refund lookup's answer in plain words.
func plainRefundLookup(lr chargeonce.LookupResult, err error) AcquirerView {
	return judged(plainRefundLookupWords(lr, err), lr, err, lr.Refund.Status == chargeonce.RefundSucceeded, string(lr.Refund.Status))
}

func plainRefundLookupWords(lr chargeonce.LookupResult, err error) AcquirerView {
	raw := describeRefundLookup(lr, err)
	switch {
	case err != nil:
		return AcquirerView{Kind: "failed", Plain: "The acquirer could not be asked: nothing is known about this refund.", Raw: raw}
	case lr.Status == chargeonce.LookupFound && lr.Refund.Status == chargeonce.RefundSucceeded:
		return AcquirerView{Kind: "succeeded", Plain: "The acquirer refunded this: the money went back to the customer.", Raw: raw}
	case lr.Status == chargeonce.LookupFound && lr.Refund.Status == chargeonce.RefundFailed:
		return AcquirerView{Kind: "refund-failed", Plain: "The acquirer refused this refund: no money went back.", Raw: raw}
	case lr.Status == chargeonce.LookupFound && lr.Refund.Status == chargeonce.RefundCanceled:
		return AcquirerView{Kind: "canceled", Plain: "The acquirer canceled this refund before it moved money: no money went back.", Raw: raw}
	case lr.Status == chargeonce.LookupSafeToSend:
		return AcquirerView{Kind: "never-seen", Plain: "The acquirer never saw this refund: by its account, no money went back.", Raw: raw}
	}
	return AcquirerView{Kind: "unsure", Plain: "The acquirer cannot tell yet what became of this refund; ask again later.", Raw: raw}
}

// RefundWarning says, for decision, what the operator must know before
// confirming a refund's resolution: empty when the acquirer agrees.
func (v AcquirerView) RefundWarning(decision chargeonce.RefundStatus) string {
	switch {
	case v.Kind == "never-seen" && decision == chargeonce.RefundSucceeded:
		return "The acquirer says it never saw this refund: by its account no money went back. Settling it as succeeded tells the merchant the customer was refunded."
	case v.Kind == "succeeded" && decision != chargeonce.RefundSucceeded:
		return "The acquirer says this refund succeeded: the money went back. Settling it " + string(decision) + " gives its amount back to the charge, so it could be refunded a second time."
	case (v.Kind == "refund-failed" || v.Kind == "canceled") && decision == chargeonce.RefundSucceeded:
		return "The acquirer says no money went back for this refund. Settling it as succeeded tells the merchant the customer was refunded."
	case v.Kind == "unsure" || v.Kind == "failed":
		return "The acquirer could not say what became of this refund. Settling now goes against no answer at all: only with its support's confirmation."
	}
	return ""
}

// RefundContradicts reports whether resolving a refund as decision needs
// force.
func (v AcquirerView) RefundContradicts(decision chargeonce.RefundStatus) bool {
	return v.needsForce(decision == chargeonce.RefundSucceeded, string(decision))
}

// lookUpRefund asks the acquirer, without claiming anything, what became
// of the merchant's refund.
func (s *Server) lookUpRefund(ctx context.Context, merchantID, refundID string) (chargeonce.Refund, AcquirerView, error) {
	rf, err := s.store.RefundGet(ctx, merchantID, refundID)
	if err != nil {
		return rf, AcquirerView{}, err
	}
	acq, err := s.refunder()
	if err != nil {
		return rf, AcquirerView{}, err
	}
	rec, err := s.store.KeyGet(ctx, merchantID, rf.IdempotencyKey)
	if err != nil {
		return rf, AcquirerView{Kind: "failed", Plain: "The refund's record could not be read, so the acquirer was not asked.", Raw: err.Error()}, nil
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.AcquirerTimeout)
	defer cancel()
	lr, lerr := acq.RefundLookup(actx, rec.LookupRequest(chargeonce.LookupToResolve))
	return rf, plainRefundLookup(lr, lerr), nil
}

// RefundJSON is a refund as the admin API shows it.
type RefundJSON struct {
	ID            string                  `json:"id"`
	ChargeID      string                  `json:"charge_id"`
	Merchant      string                  `json:"merchant"`
	AmountCents   int64                   `json:"amount_cents"`
	Currency      string                  `json:"currency"`
	Status        chargeonce.RefundStatus `json:"status"`
	FailureReason string                  `json:"failure_reason,omitempty"`
	CreatedAt     string                  `json:"created_at"`
}

func refundJSON(rf *chargeonce.Refund) *RefundJSON {
	if rf == nil {
		return nil
	}
	return &RefundJSON{ID: rf.ID, ChargeID: rf.ChargeID, Merchant: rf.MerchantID, AmountCents: rf.AmountCents,
		Currency: rf.Currency, Status: rf.Status, FailureReason: rf.FailureReason, CreatedAt: rf.CreatedAt.UTC().Format("2006-01-02T15:04:05.000Z07:00")}
}

func (s *Server) apiResolveRefund(w http.ResponseWriter, r *http.Request, admin string) error {
	var q RefundResolveRequest
	if err := decodeBody(r, &q, "status, failure_reason, reason, force"); err != nil {
		return err
	}
	res, err := s.ResolveRefund(r.Context(), admin, r.PathValue("id"), q)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, struct {
		Refund *RefundJSON `json:"refund"`
		Audit  EntryJSON   `json:"audit"`
	}{refundJSON(&res.Refund), *entryJSON(&res.Audit)})
}

// refundView is the console's page about one pending refund: what the
// acquirer says, then the form (Step "look"), or the confirmation of a
// decision (Step "confirm").
type refundView struct {
	Refund         chargeonce.Refund
	Acquirer       AcquirerView
	Step           string
	Form           RefundResolveRequest
	Disagrees      bool
	AcquirerAnswer string
}

// refundLookPage asks the acquirer first, then offers the resolve form,
// no outcome preselected.
func (s *Server) refundLookPage(w http.ResponseWriter, r *http.Request, ss *session) error {
	id := r.PathValue("id")
	rf, v, err := s.lookUpRefund(r.Context(), strings.TrimSpace(r.PostFormValue("merchant")), id)
	if err != nil {
		return err
	}
	if rf.Status.Final() {
		return chargeonce.Errorf(chargeonce.ENOTPROCESSING, "refund %s is %s already; nothing to resolve", id, rf.Status)
	}
	s.log.Info("acquirer looked up by an operator", "admin", ss.admin, "refund_id", id, "acquirer", v.Raw)
	s.render(w, r, http.StatusOK, "refund", view{Title: "What the acquirer says about the refund", Admin: ss.admin, CSRF: ss.csrf,
		Data: refundView{Refund: rf, Acquirer: v, Step: "look"}})
	return nil
}

// refundResolveForm is the refund's confirmation step, then its
// resolution (confirm=1), as resolveForm is for a charge.
func (s *Server) refundResolveForm(w http.ResponseWriter, r *http.Request, ss *session) error {
	id := r.PathValue("id")
	q := RefundResolveRequest{
		Status:        chargeonce.RefundStatus(r.PostFormValue("status")),
		FailureReason: strings.TrimSpace(r.PostFormValue("failure_reason")),
		Reason:        strings.TrimSpace(r.PostFormValue("reason")),
		Force:         r.PostFormValue("force") == "1",
	}
	merchant := strings.TrimSpace(r.PostFormValue("merchant"))
	rf, err := s.store.RefundGet(r.Context(), merchant, id)
	if err != nil {
		return err
	}
	if err := q.Check(); err != nil {
		return err
	}
	if rf.Status.Final() {
		return chargeonce.Errorf(chargeonce.ENOTPROCESSING, "refund %s is %s already; nothing to resolve", id, rf.Status)
	}
	if r.PostFormValue("confirm") != "1" {
		_, v, err := s.lookUpRefund(r.Context(), merchant, id)
		if err != nil {
			return err
		}
		s.render(w, r, http.StatusOK, "refund", view{Title: "Confirm the refund's resolution", Admin: ss.admin, CSRF: ss.csrf,
			Data: refundView{Refund: rf, Acquirer: v, Step: "confirm", Form: q}})
		return nil
	}
	res, err := s.ResolveRefund(r.Context(), ss.admin, id, q)
	if code := chargeonce.ErrorCode(err); code == chargeonce.EDISAGREES || code == chargeonce.EUNSURE {
		_, v, _ := s.lookUpRefund(r.Context(), merchant, id)
		s.render(w, r, http.StatusConflict, "refund", view{Title: "The acquirer does not confirm it", Admin: ss.admin, CSRF: ss.csrf,
			Error: chargeonce.ErrorMessage(err), Data: refundView{Refund: rf, Acquirer: v, Step: "confirm", Form: q, Disagrees: true, AcquirerAnswer: res.AcquirerAnswer}})
		return nil
	}
	if err != nil {
		return err
	}
	http.Redirect(w, r, "/admin/charges/"+url.PathEscape(rf.ChargeID)+"#"+url.PathEscape(rf.ID), http.StatusSeeOther)
	return nil
}

// refundPage shows a refund where it lives: on its charge's page.
func (s *Server) refundPage(w http.ResponseWriter, r *http.Request, _ *session) error {
	rf, err := s.store.RefundGet(r.Context(), r.URL.Query().Get("merchant"), r.PathValue("id"))
	if err != nil {
		return err
	}
	http.Redirect(w, r, "/admin/charges/"+url.PathEscape(rf.ChargeID)+"#"+url.PathEscape(rf.ID), http.StatusSeeOther)
	return nil
}

// chargeRefunds lists a charge's refunds, newest first (at most a page).
func (s *Server) chargeRefunds(ctx context.Context, ch chargeonce.Charge) ([]chargeonce.Refund, error) {
	if ch.Status != chargeonce.StatusCaptured {
		return nil, nil
	}
	page, err := s.store.RefundsList(ctx, chargeonce.RefundsListParams{MerchantID: ch.MerchantID, ChargeID: ch.ID, Limit: chargeonce.RefundsListMaxLimit})
	return page.Refunds, err
}
