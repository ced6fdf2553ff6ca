package admin

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/engine"
)

// DefaultOperationFailure is a failed capture's or cancel's failure reason
// when the operator gives none and the acquirer named none.
const DefaultOperationFailure = "operator_failed"

// OperationResolveRequest is an operator's decision about a pending
// manual capture or cancel (void) of an authorization.
type OperationResolveRequest struct {
	Status        chargeonce.OperationStatus `json:"status"`
	FailureReason string                     `json:"failure_reason,omitempty"`
	Reason        string                     `json:"reason"`
	Force         bool                       `json:"force,omitempty"`
}

// Check validates the request.
func (q *OperationResolveRequest) Check() error {
	if !q.Status.Final() {
		return chargeonce.FieldError("status", "status must be succeeded (the acquirer captured, or voided, the authorization) or failed (it refused: the charge stays authorized)")
	}
	if q.Status == chargeonce.OperationSucceeded && q.FailureReason != "" {
		return chargeonce.FieldError("failure_reason", "a succeeded capture or cancel has no failure_reason")
	}
	return checkReasons(q.Reason, q.FailureReason)
}

// OperationResolution is what a capture's or a cancel's resolution did.
type OperationResolution struct {
	Operation chargeonce.Operation
	// Charge is the authorization as the resolution left it: captured or
	// canceled when the operation succeeded, still authorized when it
	// failed.
	Charge         chargeonce.Charge
	Audit          chargeonce.HistoryEntry
	AcquirerAnswer string
}

// manualCapturer is the acquirer's side of authorizations, or an
// EUNAVAILABLE error.
func (s *Server) manualCapturer() (chargeonce.ManualCapturer, error) {
	m, ok := s.acquirer.(chargeonce.ManualCapturer)
	if !ok {
		return nil, chargeonce.Errorf(chargeonce.EUNAVAILABLE, "this service's acquirer cannot capture or cancel authorizations, so it cannot be asked about one")
	}
	return m, nil
}

// isOperation reports whether id names a capture (cp_…) or a cancel
// (vd_…).
func isOperation(id string) bool {
	k := kindOf(id)
	return k == chargeonce.KindCapture || k == chargeonce.KindCancel
}

// operationWhat names an operation's kind in messages: "capture" or
// "cancel".
func operationWhat(id string) string {
	if kindOf(id) == chargeonce.KindCancel {
		return "cancel"
	}
	return "capture"
}

// ResolveOperation settles a pending capture or cancel (cp_… or vd_…) as
// admin decided, under the rules every kind shares (see resolveRecord):
// the acquirer is asked what became of the operation's own reference
// (OperationLookup) before anything is settled, and an outcome it holds
// other than the decision contradicts it. The operation is settled by the
// statement attempts and recovery settle operations with: a succeeded
// capture settles its charge captured for the operation's amount, a
// succeeded cancel settles it canceled (each writing its charge.captured or
// charge.canceled event, once), and a failed one leaves the charge
// authorized, free for another capture or cancel. The merchant's retries of
// the capture or cancel replay the answer stored: 200 with the charge, or
// the 402 operation-failed problem.
func (s *Server) ResolveOperation(ctx context.Context, admin, id string, q OperationResolveRequest) (OperationResolution, error) {
	if err := q.Check(); err != nil {
		return OperationResolution{}, err
	}
	if !isOperation(id) {
		return OperationResolution{}, chargeonce.Errorf(chargeonce.ENOTFOUND, "capture or cancel %q not found", id)
	}
	acq, err := s.manualCapturer()
	if err != nil {
		return OperationResolution{}, err
	}
	var (
		op     chargeonce.Operation
		charge chargeonce.Charge
	)
	res, err := s.resolveRecord(ctx, admin, decision{
		id: id, kinds: []chargeonce.RecordKind{chargeonce.KindCapture, chargeonce.KindCancel}, what: operationWhat(id),
		wanted: string(q.Status), reason: q.Reason, force: q.Force,
		lookup: func(ctx context.Context, rec *chargeonce.KeyRecord) (chargeonce.LookupResult, error) {
			return acq.OperationLookup(ctx, rec.LookupRequest(chargeonce.LookupToResolve))
		},
		describe: describeOperationLookup,
		effect:   q.Status == chargeonce.OperationSucceeded,
		seen: func(lr chargeonce.LookupResult) (chargeonce.Seen, bool) {
			return seenOf(lr, lr.Operation.Status == chargeonce.OperationSucceeded, lr.Operation.Status == q.Status)
		},
		settle: func(rec *chargeonce.KeyRecord, lr chargeonce.LookupResult, found bool) (chargeonce.KeyCompleteParams, string, string) {
			op = *rec.Operation
			op.Status = q.Status
			if q.Status == chargeonce.OperationFailed {
				op.FailureReason = q.FailureReason
				if op.FailureReason == "" && found {
					op.FailureReason = lr.Operation.FailureReason
				}
				if op.FailureReason == "" {
					op.FailureReason = DefaultOperationFailure
				}
			}
			resp := engine.OperationResponse(rec.Charge, &op)
			charge = settledCharge(rec.Charge, &op)
			outcome := string(op.Status)
			if op.FailureReason != "" {
				outcome += " (" + op.FailureReason + ")"
			}
			return chargeonce.KeyCompleteParams{
				OperationStatus: op.Status, FailureReason: op.FailureReason,
				ResponseStatus: resp.Status, ResponseBody: resp.Body,
			}, outcome, string(op.Kind) + " of " + op.ChargeID + "; "
		},
	})
	if err != nil {
		return OperationResolution{AcquirerAnswer: res.answer}, err
	}
	s.log.Warn(string(op.Kind)+" resolved by an operator", "admin", admin, "operation_id", op.ID, "charge_id", op.ChargeID, "merchant", op.MerchantID,
		"status", op.Status, "failure_reason", op.FailureReason, "forced", res.forced, "acquirer", res.answer)
	return OperationResolution{Operation: op, Charge: charge, Audit: res.audit, AcquirerAnswer: res.answer}, nil
}

// settledCharge is the authorized charge ch as op's settlement leaves it.
func settledCharge(ch chargeonce.Charge, op *chargeonce.Operation) chargeonce.Charge {
	if op.Status != chargeonce.OperationSucceeded {
		return ch
	}
	ch.Status, ch.CapturedCents = chargeonce.StatusCanceled, 0
	if op.Kind == chargeonce.KindCapture {
		ch.Status, ch.CapturedCents = chargeonce.StatusCaptured, op.AmountCents
	}
	return ch
}

// describeOperationLookup says in a line what the acquirer answered about
// a capture or a cancel.
func describeOperationLookup(lr chargeonce.LookupResult, err error) string {
	if err != nil {
		return "lookup failed: " + err.Error()
	}
	s := lr.Status.String()
	if lr.Status == chargeonce.LookupFound {
		s = "found: " + string(lr.Operation.Status)
		if lr.Operation.FailureReason != "" {
			s += " (" + lr.Operation.FailureReason + ")"
		}
	}
	if lr.Reason != "" {
		s += " — " + lr.Reason
	}
	return s
}

// plainOperationLookup puts an operation lookup's answer in plain words.
func plainOperationLookup(kind chargeonce.RecordKind, lr chargeonce.LookupResult, err error) AcquirerView {
	return judged(plainOperationLookupWords(kind, lr, err), lr, err, lr.Operation.Status == chargeonce.OperationSucceeded, string(lr.Operation.Status))
}

func plainOperationLookupWords(kind chargeonce.RecordKind, lr chargeonce.LookupResult, err error) AcquirerView {
	raw := describeOperationLookup(lr, err)
	this, done := "capture", "made this capture: the money moved"
	if kind == chargeonce.KindCancel {
		this, done = "void", "voided the authorization: the hold on the card is released and no money moved"
	}
	switch {
	case err != nil:
		return AcquirerView{Kind: "failed", Plain: "The acquirer could not be asked: nothing is known about this " + this + ".", Raw: raw}
	case lr.Status == chargeonce.LookupFound && lr.Operation.Status == chargeonce.OperationSucceeded:
		return AcquirerView{Kind: "succeeded", Plain: "The acquirer " + done + ".", Raw: raw}
	case lr.Status == chargeonce.LookupFound:
		return AcquirerView{Kind: "op-failed", Plain: "The acquirer refused this " + this + ": the authorization is as it was.", Raw: raw}
	case lr.Status == chargeonce.LookupSafeToSend:
		return AcquirerView{Kind: "never-seen", Plain: "The acquirer never saw this " + this + ": by its account, the authorization is as it was.", Raw: raw}
	}
	return AcquirerView{Kind: "unsure", Plain: "The acquirer cannot tell yet what became of this " + this + "; ask again later.", Raw: raw}
}

// OperationWarning says, for decision, what the operator must know before
// confirming a capture's or a cancel's resolution: empty when the acquirer
// agrees.
func (v AcquirerView) OperationWarning(decision chargeonce.OperationStatus) string {
	switch {
	case v.Kind == "never-seen" && decision == chargeonce.OperationSucceeded:
		return "The acquirer says it never saw this operation: by its account the authorization is as it was. Settling it as succeeded tells the merchant the charge was captured (or voided)."
	case v.Kind == "succeeded" && decision == chargeonce.OperationFailed:
		return "The acquirer says this operation succeeded. Settling it failed leaves the charge authorized here while the acquirer settled it: the merchant may capture or cancel it again, and the acquirer will refuse."
	case v.Kind == "op-failed" && decision == chargeonce.OperationSucceeded:
		return "The acquirer says it refused this operation. Settling it as succeeded tells the merchant the charge was captured (or voided) when it was not."
	case v.Kind == "unsure" || v.Kind == "failed":
		return "The acquirer could not say what became of this operation. Settling now goes against no answer at all: only with its support's confirmation."
	}
	return ""
}

// OperationContradicts reports whether resolving a capture or cancel as
// decision needs force.
func (v AcquirerView) OperationContradicts(decision chargeonce.OperationStatus) bool {
	return v.needsForce(decision == chargeonce.OperationSucceeded, string(decision))
}

// lookUpOperation asks the acquirer, without claiming anything, what became
// of the capture or cancel in.
func (s *Server) lookUpOperation(ctx context.Context, in chargeonce.OperationInspection) AcquirerView {
	acq, err := s.manualCapturer()
	if err != nil {
		return AcquirerView{Kind: "failed", Plain: "This service's acquirer cannot capture or cancel authorizations, so it was not asked.", Raw: err.Error()}
	}
	rec, err := s.store.KeyGet(ctx, in.Operation.MerchantID, in.Operation.IdempotencyKey)
	if err != nil || rec.ObjectID() != in.Operation.ID {
		raw := "its record is gone"
		if err != nil {
			raw = err.Error()
		}
		return AcquirerView{Kind: "failed", Plain: "The operation's record could not be read, so the acquirer was not asked.", Raw: raw}
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.AcquirerTimeout)
	defer cancel()
	lr, lerr := acq.OperationLookup(actx, rec.LookupRequest(chargeonce.LookupToResolve))
	return plainOperationLookup(in.Operation.Kind, lr, lerr)
}

// OperationJSON is a capture or a cancel as the admin API shows it.
type OperationJSON struct {
	ID            string                     `json:"id"`
	Kind          string                     `json:"kind"`
	ChargeID      string                     `json:"charge_id"`
	Merchant      string                     `json:"merchant"`
	AmountCents   int64                      `json:"amount_cents"`
	Currency      string                     `json:"currency"`
	Status        chargeonce.OperationStatus `json:"status"`
	FailureReason string                     `json:"failure_reason,omitempty"`
	CreatedAt     time.Time                  `json:"created_at"`
}

func operationJSON(op *chargeonce.Operation) *OperationJSON {
	if op == nil {
		return nil
	}
	return &OperationJSON{ID: op.ID, Kind: kindName(op.Kind), ChargeID: op.ChargeID, Merchant: op.MerchantID,
		AmountCents: op.AmountCents, Currency: op.Currency, Status: op.Status, FailureReason: op.FailureReason, CreatedAt: op.CreatedAt}
}

// OperationDetailJSON is a capture or a cancel with its charge, its record
// and its history.
type OperationDetailJSON struct {
	Operation OperationJSON `json:"operation"`
	Charge    ChargeJSON    `json:"charge"`
	Record    *RecordJSON   `json:"record"`
	History   []EntryJSON   `json:"history"`
}

// operationDetail reads a capture or a cancel with its timeline.
func (s *Server) operationDetail(ctx context.Context, id string) (chargeonce.OperationInspection, []chargeonce.HistoryEntry, error) {
	if !isOperation(id) {
		return chargeonce.OperationInspection{}, nil, chargeonce.Errorf(chargeonce.ENOTFOUND, "capture or cancel %q not found", id)
	}
	in, err := s.ops.OperationInspect(ctx, id)
	if err != nil {
		return in, nil, err
	}
	stored, err := s.ops.ChargeHistory(ctx, id)
	if err != nil {
		return in, nil, err
	}
	return in, OperationTimeline(in, stored), nil
}

// OperationTimeline is a capture's or a cancel's history: what its row
// says (inserted, settled) around the entries appended on the unusual
// paths (an operator's resolution, or its refusal), in time order. A
// pending operation's record was committed before its acquirer call, so it
// shows that call sent with no answer stored.
func OperationTimeline(in chargeonce.OperationInspection, stored []chargeonce.HistoryEntry) []chargeonce.HistoryEntry {
	op := in.Operation
	entry := func(at time.Time, kind chargeonce.HistoryKind, actor, outcome, detail string) chargeonce.HistoryEntry {
		return chargeonce.HistoryEntry{ChargeID: op.ID, MerchantID: op.MerchantID, At: at, Kind: kind,
			Actor: actor, Outcome: outcome, Detail: detail, Derived: true}
	}
	verb, call := "capture", chargeonce.HistoryCapture
	if op.Kind == chargeonce.KindCancel {
		verb, call = "void", HistoryVoid
	}
	out := []chargeonce.HistoryEntry{entry(op.CreatedAt, chargeonce.HistoryInserted, engine.ActorAttempt, "pending",
		string(op.Kind)+" of "+op.ChargeID+" for "+chargeonce.FormatAmount(op.AmountCents, op.Currency))}
	if op.Status == chargeonce.OperationPending {
		e := entry(op.CreatedAt, call, engine.ActorAttempt, CaptureSentNoAnswer,
			"the record was committed to send the "+verb+"; no answer from the acquirer was ever stored, so the authorization may have been settled: recovery looks the reference up before sending it again")
		if in.InFlight {
			e.Outcome, e.Detail = CaptureInFlight, "an attempt, recovery or a resolution holds the lease and waits for the acquirer's answer"
		}
		return append(append(out, e), stored...)
	}
	outcome := string(op.Status)
	if op.FailureReason != "" {
		outcome += " (" + op.FailureReason + ")"
	}
	out = append(out, stored...)
	return append(out, entry(in.UpdatedAt, chargeonce.HistorySettled, operationSettledBy(stored), outcome, "the charge is "+string(in.Charge.Status)))
}

// HistoryVoid is the kind of a cancel's acquirer call (a void) on its
// timeline, derived from its row as a capture's is.
const HistoryVoid chargeonce.HistoryKind = "void"

// operationSettledBy names who settled an operation: the last
// resolution's admin; else its attempt or recovery, which append no trail
// for operations, so which one is not known.
func operationSettledBy(stored []chargeonce.HistoryEntry) string {
	for i := len(stored) - 1; i >= 0; i-- {
		if stored[i].Kind == chargeonce.HistoryResolution {
			return stored[i].Actor
		}
	}
	return engine.ActorAttempt + " or " + engine.ActorRecovery
}

func (s *Server) apiOperation(w http.ResponseWriter, r *http.Request, _ string) error {
	in, tl, err := s.operationDetail(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	out := OperationDetailJSON{Operation: *operationJSON(&in.Operation), Charge: chargeJSON(&in.Charge),
		Record: recordJSON(&in.RecordInspection), History: []EntryJSON{}}
	for i := range tl {
		out.History = append(out.History, *entryJSON(&tl[i]))
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) apiResolveOperation(w http.ResponseWriter, r *http.Request, admin string) error {
	var q OperationResolveRequest
	if err := decodeBody(r, &q, "status, failure_reason, reason, force"); err != nil {
		return err
	}
	res, err := s.ResolveOperation(r.Context(), admin, r.PathValue("id"), q)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, struct {
		Operation *OperationJSON `json:"operation"`
		Charge    ChargeJSON     `json:"charge"`
		Audit     EntryJSON      `json:"audit"`
	}{operationJSON(&res.Operation), chargeJSON(&res.Charge), *entryJSON(&res.Audit)})
}

// operationView is the console's page about one capture or cancel: its
// facts and timeline (Step "view"), what the acquirer says and the form
// (Step "look"), or the confirmation of a decision (Step "confirm").
type operationView struct {
	In             chargeonce.OperationInspection
	Timeline       []chargeonce.HistoryEntry
	Acquirer       AcquirerView
	Step           string
	Form           OperationResolveRequest
	Disagrees      bool
	AcquirerAnswer string
}

// operationTitle is a page title naming the operation.
func operationTitle(op *chargeonce.Operation) string {
	if op.Kind == chargeonce.KindCancel {
		return "Cancel (void) " + op.ID
	}
	return "Capture " + op.ID
}

// operationPage is a capture's or a cancel's facts and timeline.
func (s *Server) operationPage(w http.ResponseWriter, r *http.Request, ss *session) error {
	in, tl, err := s.operationDetail(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	s.render(w, r, http.StatusOK, "operation", view{Title: operationTitle(&in.Operation), Admin: ss.admin, CSRF: ss.csrf,
		Data: operationView{In: in, Timeline: tl, Step: "view"}})
	return nil
}

// pendingOperation reads a capture or cancel that may be resolved.
func (s *Server) pendingOperation(ctx context.Context, id string) (chargeonce.OperationInspection, error) {
	in, _, err := s.operationDetail(ctx, id)
	if err != nil {
		return in, err
	}
	if in.Operation.Status.Final() {
		return in, chargeonce.Errorf(chargeonce.ENOTPROCESSING, "%s %s is %s already; nothing to resolve", in.Operation.Kind, id, in.Operation.Status)
	}
	return in, nil
}

// operationLookPage asks the acquirer first, then offers the resolve form,
// no outcome preselected.
func (s *Server) operationLookPage(w http.ResponseWriter, r *http.Request, ss *session) error {
	in, err := s.pendingOperation(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	v := s.lookUpOperation(r.Context(), in)
	s.log.Info("acquirer looked up by an operator", "admin", ss.admin, "operation_id", in.Operation.ID, "acquirer", v.Raw)
	s.render(w, r, http.StatusOK, "operation", view{Title: "What the acquirer says about the " + operationWhat(in.Operation.ID), Admin: ss.admin, CSRF: ss.csrf,
		Data: operationView{In: in, Acquirer: v, Step: "look"}})
	return nil
}

// operationResolveForm is the operation's confirmation step, then its
// resolution (confirm=1), as resolveForm is for a charge.
func (s *Server) operationResolveForm(w http.ResponseWriter, r *http.Request, ss *session) error {
	id := r.PathValue("id")
	q := OperationResolveRequest{
		Status:        chargeonce.OperationStatus(r.PostFormValue("status")),
		FailureReason: strings.TrimSpace(r.PostFormValue("failure_reason")),
		Reason:        strings.TrimSpace(r.PostFormValue("reason")),
		Force:         r.PostFormValue("force") == "1",
	}
	in, err := s.pendingOperation(r.Context(), id)
	if err != nil {
		return err
	}
	if err := q.Check(); err != nil {
		return err
	}
	if r.PostFormValue("confirm") != "1" {
		s.render(w, r, http.StatusOK, "operation", view{Title: "Confirm the " + operationWhat(id) + "'s resolution", Admin: ss.admin, CSRF: ss.csrf,
			Data: operationView{In: in, Acquirer: s.lookUpOperation(r.Context(), in), Step: "confirm", Form: q}})
		return nil
	}
	res, err := s.ResolveOperation(r.Context(), ss.admin, id, q)
	if code := chargeonce.ErrorCode(err); code == chargeonce.EDISAGREES || code == chargeonce.EUNSURE {
		s.render(w, r, http.StatusConflict, "operation", view{Title: "The acquirer does not confirm it", Admin: ss.admin, CSRF: ss.csrf,
			Error: chargeonce.ErrorMessage(err), Data: operationView{In: in, Acquirer: s.lookUpOperation(r.Context(), in), Step: "confirm",
				Form: q, Disagrees: true, AcquirerAnswer: res.AcquirerAnswer}})
		return nil
	}
	if err != nil {
		return err
	}
	http.Redirect(w, r, "/admin/operations/"+url.PathEscape(id), http.StatusSeeOther)
	return nil
}
