package admin

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/idempotency"
	"github.com/chargeonce/chargeonce/internal/httpserve"
	"github.com/chargeonce/chargeonce/wire"
)

// maxBody bounds a request body of the admin API and console.
const maxBody = 16 << 10

// routes mounts the API and the console.
func (s *Server) routes() {
	m := http.NewServeMux()
	m.Handle("GET /admin/v1/charges", s.api(s.apiList))
	m.Handle("GET /admin/v1/charges/{id}", s.api(s.apiCharge))
	m.Handle("POST /admin/v1/charges/{id}/resolve", s.api(s.apiResolve))
	m.Handle("POST /admin/v1/refunds/{id}/resolve", s.api(s.apiResolveRefund))
	m.Handle("GET /admin/v1/operations/{id}", s.api(s.apiOperation))
	m.Handle("POST /admin/v1/operations/{id}/resolve", s.api(s.apiResolveOperation))
	m.Handle("GET /admin/v1/audit", s.api(s.apiAudit))
	s.consoleRoutes(m)
	s.mux = m
}

// apiHandler is an API handler that knows its admin.
type apiHandler func(w http.ResponseWriter, r *http.Request, admin string) error

// api authenticates a bearer admin key, logs the call with the admin's
// name, and answers errors as problem+json.
func (s *Server) api(h apiHandler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		addr := s.clientAddr(r)
		var admin string
		var err error
		// The key first, always: a right one is accepted whatever wrong
		// ones others sent; only a wrong one is counted, and past the
		// budgets answered 429.
		if a, ok := s.bearer(r); !ok {
			err = chargeonce.Errorf(chargeonce.EUNAUTHORIZED, "send an admin key as Authorization: Bearer <admin-key>; merchants' API keys do not work here")
			if s.keys.loopbackHosts && !httpserve.LoopbackHost(r.Host) {
				err = chargeonce.Errorf(chargeonce.EUNAUTHORIZED, "the demo admin key answers only requests to localhost, 127.0.0.1 or [::1]")
			}
			if r.Header.Get("Authorization") != "" {
				if throttled, wait := s.guard.failed(addr); throttled {
					err = tooManyFailures(wait)
				}
			}
		} else {
			admin = a
			r.Body = http.MaxBytesReader(w, r.Body, maxBody)
			err = h(w, r, admin)
		}
		status := http.StatusOK
		if err != nil {
			status = writeProblem(w, err)
		}
		s.logCall(r, admin, status, start, err)
	})
}

// logCall logs one admin call: every call, with the admin's name.
func (s *Server) logCall(r *http.Request, admin string, status int, start time.Time, err error) {
	attrs := []any{"admin", admin, "method", r.Method, "route", r.Pattern, "status", status,
		"duration", time.Since(start).Round(time.Microsecond).String(), "client", s.clientAddr(r)}
	if id := r.PathValue("id"); id != "" {
		attrs = append(attrs, "charge_id", id)
	}
	if err != nil && status >= 500 {
		attrs = append(attrs, "err", err)
	}
	if admin == "" {
		admin = "-"
		attrs[1] = admin
	}
	if status == http.StatusUnauthorized || status == http.StatusTooManyRequests {
		// A wrong key, or too many of them: who tried is worth a warning.
		s.log.Warn("admin call refused", attrs...)
		return
	}
	s.log.Info("admin call", attrs...)
}

func (s *Server) bearer(r *http.Request) (string, bool) {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
		return "", false
	}
	return s.keys.lookup(strings.TrimSpace(token), r.Host)
}

// tooManyFailures is the answer to a wrong key from an address (or from
// everyone) past its budget of wrong admin keys.
func tooManyFailures(wait time.Duration) error {
	e := chargeonce.Errorf(chargeonce.ERATELIMITED, "not an admin key, and too many wrong admin keys from this address (or from everywhere): retry later")
	e.RetryAfter = max(wait, time.Second)
	return e
}

// writeProblem answers err as problem+json and returns the status.
func writeProblem(w http.ResponseWriter, err error) int {
	status, body := wire.Problem(err, "")
	if d := chargeonce.ErrorRetryAfter(err); d > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(d.Seconds()))))
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(body)
	return status
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, err = w.Write(append(b, '\n'))
	return err
}

// ChargeJSON is a charge as the admin API shows it: no payment token, and
// the idempotency key only as its hash (the hash the logs carry).
type ChargeJSON struct {
	ID          string            `json:"id"`
	Merchant    string            `json:"merchant"`
	OrderID     int64             `json:"order_id"`
	AmountCents int64             `json:"amount_cents"`
	Currency    string            `json:"currency"`
	Status      chargeonce.Status `json:"status"`
	DeclineCode string            `json:"decline_code,omitempty"`
	Description string            `json:"description,omitempty"`
	CreatedAt   time.Time         `json:"created_at"`
	KeyHash     string            `json:"idempotency_key_hash"`
}

func chargeJSON(c *chargeonce.Charge) ChargeJSON {
	return ChargeJSON{
		ID: c.ID, Merchant: c.MerchantID, OrderID: c.OrderID, AmountCents: c.AmountCents, Currency: c.Currency,
		Status: c.Status, DeclineCode: c.DeclineCode, Description: c.Description, CreatedAt: c.CreatedAt,
		KeyHash: idempotency.KeyHash(c.MerchantID, c.IdempotencyKey),
	}
}

// EntryJSON is a history entry.
type EntryJSON struct {
	ID       int64                  `json:"id,omitempty"`
	ChargeID string                 `json:"charge_id"`
	At       time.Time              `json:"at"`
	Kind     chargeonce.HistoryKind `json:"kind"`
	Actor    string                 `json:"actor"`
	Outcome  string                 `json:"outcome,omitempty"`
	Detail   string                 `json:"detail,omitempty"`
	Reason   string                 `json:"reason,omitempty"`
	Forced   bool                   `json:"forced,omitempty"`
	Derived  bool                   `json:"derived,omitempty"`
}

func entryJSON(e *chargeonce.HistoryEntry) *EntryJSON {
	if e == nil {
		return nil
	}
	return &EntryJSON{ID: e.ID, ChargeID: e.ChargeID, At: e.At, Kind: e.Kind, Actor: e.Actor, Outcome: e.Outcome,
		Detail: e.Detail, Reason: e.Reason, Forced: e.Forced, Derived: e.Derived}
}

// StuckJSON is one row of the stuck list: a stuck operation of some kind
// (a charge; a refund, a capture or a cancel of the charge shown), its
// charge, and its record.
type StuckJSON struct {
	// Kind is what is stuck: "charge"; "refund" (Refund says which); or
	// "capture" or "cancel" (a void), Operation saying which. The other
	// fields are the charge's.
	Kind      string         `json:"kind"`
	Refund    *RefundJSON    `json:"refund,omitempty"`
	Operation *OperationJSON `json:"operation,omitempty"`
	ChargeJSON
	AgeSeconds       float64    `json:"age_seconds"`
	AcquirerAttempts int        `json:"acquirer_attempts"`
	LastOutcome      *EntryJSON `json:"last_outcome"`
	NextAttemptAt    time.Time  `json:"next_attempt_at"`
	// InFlight marks a charge an attempt, recovery or a resolution drives
	// under a live lease; listed only with include_leased=1.
	InFlight bool `json:"in_flight"`
}

// stuckParams reads the stuck list's query.
func stuckParams(r *http.Request) (chargeonce.StuckListParams, error) {
	q := r.URL.Query()
	p := chargeonce.StuckListParams{Limit: chargeonce.StuckListDefaultLimit, MerchantID: q.Get("merchant"), After: q.Get("after")}
	if st := q.Get("status"); st != "" && st != string(chargeonce.StatusProcessing) {
		return p, chargeonce.FieldError("status", "only processing charges are listed here (status=processing); look a settled charge up by its id")
	}
	if v := q.Get("older_than"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return p, chargeonce.FieldError("older_than", "older_than must be a duration such as 10m or 2h")
		}
		p.OlderThan = d
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return p, chargeonce.FieldError("limit", "limit must be a whole number")
		}
		p.Limit = n
	}
	switch q.Get("include_leased") {
	case "", "0", "false":
	case "1", "true":
		p.IncludeLeased = true
	default:
		return p, chargeonce.FieldError("include_leased", "include_leased must be 1 or 0")
	}
	return p, p.Check()
}

func (s *Server) apiList(w http.ResponseWriter, r *http.Request, _ string) error {
	p, err := stuckParams(r)
	if err != nil {
		return err
	}
	page, err := s.ops.ChargesListStuck(r.Context(), p)
	if err != nil {
		return err
	}
	out := struct {
		Data    []StuckJSON `json:"data"`
		HasMore bool        `json:"has_more"`
	}{Data: []StuckJSON{}, HasMore: page.HasMore}
	for i := range page.Charges {
		c := &page.Charges[i]
		out.Data = append(out.Data, StuckJSON{
			Kind: kindName(c.Kind()), Refund: refundJSON(c.Refund), Operation: operationJSON(c.Operation),
			ChargeJSON: chargeJSON(&c.Charge), AgeSeconds: c.Age.Seconds(), AcquirerAttempts: c.Attempts,
			LastOutcome: entryJSON(c.Last), NextAttemptAt: c.NextAttempt, InFlight: c.InFlight,
		})
	}
	return writeJSON(w, http.StatusOK, out)
}

// ChargeDetailJSON is a charge with its record and history.
type ChargeDetailJSON struct {
	Charge  ChargeJSON  `json:"charge"`
	Record  *RecordJSON `json:"record"`
	History []EntryJSON `json:"history"`
}

// RecordJSON is what the idempotency record says, while it exists.
type RecordJSON struct {
	State            chargeonce.KeyState `json:"state"`
	AcquirerAttempts int                 `json:"acquirer_attempts"`
	NextAttemptAt    *time.Time          `json:"next_attempt_at,omitempty"`
}

// recordJSON is the record of an inspected charge, refund or operation as
// the detail routes answer it; nil when it has been swept.
func recordJSON(r *chargeonce.RecordInspection) *RecordJSON {
	if !r.HasRecord {
		return nil
	}
	out := &RecordJSON{State: r.State, AcquirerAttempts: r.Attempts}
	if r.State == chargeonce.KeyProcessing {
		out.NextAttemptAt = &r.NextAttempt
	}
	return out
}

// detail reads a charge with its timeline.
func (s *Server) detail(r *http.Request, id string) (chargeonce.ChargeInspection, []chargeonce.HistoryEntry, error) {
	in, err := s.ops.ChargeInspect(r.Context(), id)
	if err != nil {
		return in, nil, err
	}
	stored, err := s.ops.ChargeHistory(r.Context(), id)
	if err != nil {
		return in, nil, err
	}
	deliveries, err := s.deliveries(r.Context(), in.Charge)
	if err != nil {
		return in, nil, err
	}
	return in, append(Timeline(in, stored), deliveries...), nil
}

// deliveries are the attempts to deliver ch's settlement event, oldest
// first: none while it is processing or when its merchant had no enabled
// endpoint when it settled.
func (s *Server) deliveries(ctx context.Context, ch chargeonce.Charge) ([]chargeonce.HistoryEntry, error) {
	if ch.Status == chargeonce.StatusProcessing {
		return nil, nil
	}
	// By the settlement event's id, not the charge's newest event: a
	// refund's events are newer, and their attempts are not the
	// settlement's (issue 48).
	_, attempts, err := s.store.WebhookEventGet(ctx, ch.MerchantID, chargeonce.SettlementEventID(ch.ID))
	if chargeonce.ErrorCode(err) == chargeonce.ENOTFOUND {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := make([]chargeonce.HistoryEntry, len(attempts))
	for i, a := range attempts {
		outcome := "no answer"
		if a.StatusCode != 0 {
			outcome = strconv.Itoa(a.StatusCode)
		}
		detail := a.EventID + " to " + a.EndpointID
		if a.Error != "" {
			detail += ": " + a.Error
		}
		out[i] = chargeonce.HistoryEntry{
			ChargeID: ch.ID, MerchantID: ch.MerchantID, At: a.At, Kind: chargeonce.HistoryWebhook,
			Actor: "webhook sender", Outcome: outcome, Detail: detail, Derived: true,
		}
	}
	return out, nil
}

func (s *Server) apiCharge(w http.ResponseWriter, r *http.Request, _ string) error {
	in, tl, err := s.detail(r, r.PathValue("id"))
	if err != nil {
		return err
	}
	out := ChargeDetailJSON{Charge: chargeJSON(&in.Charge), Record: recordJSON(&in.RecordInspection), History: []EntryJSON{}}
	for i := range tl {
		out.History = append(out.History, *entryJSON(&tl[i]))
	}
	return writeJSON(w, http.StatusOK, out)
}

// decodeBody reads r's body as one JSON object of the fields named.
func decodeBody(r *http.Request, v any, fields string) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return chargeonce.Errorf(chargeonce.ETOOLARGE, "the body must be at most %d bytes", maxBody)
		}
		return chargeonce.Errorf(chargeonce.EINVALID, "the body must be a JSON object: %s", fields)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return chargeonce.Errorf(chargeonce.EINVALID, "the body must hold one JSON object")
	}
	return nil
}

func (s *Server) apiResolve(w http.ResponseWriter, r *http.Request, admin string) error {
	var q ResolveRequest
	if err := decodeBody(r, &q, "status, decline_code, reason, force"); err != nil {
		return err
	}
	res, err := s.Resolve(r.Context(), admin, r.PathValue("id"), q)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, struct {
		Charge ChargeJSON `json:"charge"`
		Audit  EntryJSON  `json:"audit"`
	}{chargeJSON(&res.Charge), *entryJSON(&res.Audit)})
}

// auditParams reads a page of the audit trail from r's query (?before=ID),
// for the API and the console alike.
func auditParams(r *http.Request) (chargeonce.AuditListParams, error) {
	p := chargeonce.AuditListParams{Limit: chargeonce.StuckListDefaultLimit}
	if v := r.URL.Query().Get("before"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return p, chargeonce.FieldError("before", "before must be an audit entry's id")
		}
		p.Before = n
	}
	return p, nil
}

func (s *Server) apiAudit(w http.ResponseWriter, r *http.Request, _ string) error {
	p, err := auditParams(r)
	if err != nil {
		return err
	}
	// One entry more than the page says whether there are older ones.
	limit := p.Limit
	p.Limit++
	es, err := s.ops.AuditList(r.Context(), p)
	if err != nil {
		return err
	}
	out := struct {
		Data    []EntryJSON `json:"data"`
		HasMore bool        `json:"has_more"`
	}{Data: []EntryJSON{}, HasMore: len(es) > limit}
	es = es[:min(len(es), limit)]
	for i := range es {
		out.Data = append(out.Data, *entryJSON(&es[i]))
	}
	return writeJSON(w, http.StatusOK, out)
}

// KindOf is the kind of record an object's id names, by its prefix: re_ a
// refund, cp_ a capture, vd_ a cancel (void), anything else a charge.
func KindOf(id string) chargeonce.RecordKind { return kindOf(id) }

// ResolvePath is the admin API route that resolves the object id names: a
// charge's, a refund's, or a capture's or cancel's (SPEC "Operators").
func ResolvePath(id string) string {
	switch kindOf(id) {
	case chargeonce.KindRefund:
		return "/admin/v1/refunds/" + url.PathEscape(id) + "/resolve"
	case chargeonce.KindCapture, chargeonce.KindCancel:
		return "/admin/v1/operations/" + url.PathEscape(id) + "/resolve"
	}
	return "/admin/v1/charges/" + url.PathEscape(id) + "/resolve"
}

// KindName names a record's kind as the admin API does: "charge",
// "refund", "capture" or "cancel".
func KindName(k chargeonce.RecordKind) string { return kindName(k) }

// kindName names a record's kind in the API and on the console.
func kindName(k chargeonce.RecordKind) string {
	if k == chargeonce.KindCharge {
		return "charge"
	}
	return string(k)
}
