package acquirer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/chargeonce/chargeonce"
)

// MaxBodyBytes bounds a capture request's body; larger bodies get 413.
const MaxBodyBytes = 64 << 10

// captureResponse is the body of a 200 answer to POST /v1/captures.
type captureResponse struct {
	Reference   string            `json:"reference"`
	Status      chargeonce.Status `json:"status"`
	DeclineCode *string           `json:"decline_code"`
}

// Handler returns the stand-alone HTTP API of the simulator
// (`chargeonce acquirer`):
//
//	POST /v1/captures              capture; 200 {"reference","status","decline_code"}
//	GET  /v1/captures/{reference}  the first settled capture (waiting for one
//	                               under way); 404 when there is none
//	GET  /v1/captures?order_id=N&merchant=M  the order's captures (JSON array)
//	GET  /v1/stats                 {"capture_requests","captures","duplicate_requests"}
//	GET  /v1/ledger?from=T&to=T[&starting_after=C][&limit=N]
//	                               one page of the ledger {"data","next"}
//	                               (reconciliation; see Simulator.LedgerList)
//
// The reference of POST /v1/captures comes from the Idempotency-Key header
// (bare or as an RFC 8941 string) and the body's "reference". Either alone is
// enough; when both are present they must be equal, or the answer is 400, so
// that a client bug cannot capture under a reference it did not mean.
//
// Errors are application/problem+json: 400 validation-failed (naming the
// field) or invalid-idempotency-key, 404 not-found, 405, 409
// request-in-progress (a GET that gave up waiting for a capture under way),
// 413, and 503
// unavailable for the fault tokens, whose outcome the client cannot
// know. Answers carry Cache-Control: no-store.
func Handler(sim *Simulator) http.Handler {
	h := &handler{sim: sim}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/captures", h.capture)
	mux.HandleFunc("GET /v1/captures", h.list)
	mux.HandleFunc("GET /v1/captures/{reference}", h.get)
	mux.HandleFunc("GET /v1/stats", h.stats)
	mux.HandleFunc("POST /v1/refunds", h.refund)
	mux.HandleFunc("GET /v1/refunds/{reference}", h.getRefund)
	mux.HandleFunc("/v1/refunds", methodNotAllowed("POST"))
	mux.HandleFunc("/v1/refunds/{reference}", methodNotAllowed("GET, HEAD"))
	mux.HandleFunc("GET /v1/ledger", h.ledger)             // ledger.go
	mux.HandleFunc("POST /v1/authorizations", h.authorize) // capture.go
	mux.HandleFunc("POST /v1/authorizations/capture", h.operation(chargeonce.LedgerCapture))
	mux.HandleFunc("POST /v1/authorizations/void", h.operation(chargeonce.LedgerVoid))
	mux.HandleFunc("GET /v1/operations/{reference}", h.getOperation)
	mux.HandleFunc("POST /v1/fences", h.fence) // finality.go
	mux.HandleFunc("/v1/fences", methodNotAllowed("POST"))
	mux.HandleFunc("/v1/authorizations", methodNotAllowed("POST"))
	mux.HandleFunc("/v1/authorizations/capture", methodNotAllowed("POST"))
	mux.HandleFunc("/v1/authorizations/void", methodNotAllowed("POST"))
	mux.HandleFunc("/v1/operations/{reference}", methodNotAllowed("GET, HEAD"))
	// The patterns without a method catch the methods the ones above do
	// not allow, so that 405 is problem+json too; "/" catches the rest.
	mux.HandleFunc("/v1/captures", methodNotAllowed("GET, HEAD, POST"))
	mux.HandleFunc("/v1/captures/{reference}", methodNotAllowed("GET, HEAD"))
	mux.HandleFunc("/v1/stats", methodNotAllowed("GET, HEAD"))
	mux.HandleFunc("/v1/ledger", methodNotAllowed("GET, HEAD"))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, chargeonce.Errorf(chargeonce.ENOTFOUND, "no route for %s %s", r.Method, r.URL.Path))
	})
	return mux
}

type handler struct {
	sim *Simulator
}

func (h *handler) capture(w http.ResponseWriter, r *http.Request) {
	req, err := decodeCaptureRequest(w, r)
	if err != nil {
		writeError(w, err)
		return
	}
	if err := h.sim.arrivedLate(req.Reference, sentAt(r)); err != nil {
		writeError(w, err)
		return
	}
	res, err := h.sim.Capture(r.Context(), req)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, captureResponse{
		Reference:   res.Reference,
		Status:      res.Status,
		DeclineCode: nullable(res.DeclineCode),
	})
}

// decodeCaptureRequest reads the body and reconciles its reference with the
// Idempotency-Key header.
func decodeCaptureRequest(w http.ResponseWriter, r *http.Request) (chargeonce.CaptureRequest, error) {
	var req chargeonce.CaptureRequest
	if r.ContentLength > MaxBodyBytes {
		// Refused before reading: the server can then drain the body and
		// keep the connection, where tripping MaxBytesReader closes it.
		return req, decodeError(&http.MaxBytesError{Limit: MaxBodyBytes})
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, decodeError(err)
	}
	if err := dec.Decode(&struct{}{}); err != io.EOF {
		if errors.As(err, new(*http.MaxBytesError)) {
			return req, decodeError(err)
		}
		return req, chargeonce.FieldError("body", "the body must hold exactly one JSON object")
	}

	if vals := r.Header.Values("Idempotency-Key"); len(vals) > 0 {
		key, err := parseReferenceHeader(vals)
		if err != nil {
			return req, err
		}
		switch req.Reference {
		case "":
			req.Reference = key
		case key:
		default:
			return req, chargeonce.FieldError("reference", "reference %q does not match the Idempotency-Key header %q", req.Reference, key)
		}
	}
	if req.Reference == "" {
		return req, chargeonce.FieldError("reference", "send the reference in the Idempotency-Key header or the body's reference field")
	}
	return req, nil
}

// parseReferenceHeader returns the reference an Idempotency-Key header
// carries: bare, or as an RFC 8941 string without escapes.
func parseReferenceHeader(vals []string) (string, error) {
	if len(vals) > 1 {
		return "", chargeonce.Errorf(chargeonce.EINVALIDKEY, "send exactly one Idempotency-Key header")
	}
	v := strings.Trim(vals[0], " \t")
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		v = v[1 : len(v)-1]
	}
	if !visibleASCII(v, MaxReferenceLen) || strings.ContainsAny(v, `"\`) {
		return "", chargeonce.Errorf(chargeonce.EINVALIDKEY, "the Idempotency-Key must be a reference of 1 to %d visible ASCII characters", MaxReferenceLen)
	}
	return v, nil
}

// decodeError turns a JSON decoding error into a client error that names the
// offending field where it can.
func decodeError(err error) error {
	var (
		maxErr    *http.MaxBytesError
		typeErr   *json.UnmarshalTypeError
		syntaxErr *json.SyntaxError
	)
	switch {
	case errors.As(err, &maxErr):
		return chargeonce.Errorf(chargeonce.ETOOLARGE, "the body is larger than %d bytes", MaxBodyBytes)
	case errors.As(err, &typeErr):
		field := typeErr.Field
		if field == "" {
			field = "body"
		}
		return chargeonce.FieldError(field, "%s must be a JSON %s", field, jsonKind(typeErr.Type.Kind().String()))
	case errors.As(err, &syntaxErr), errors.Is(err, io.ErrUnexpectedEOF):
		return chargeonce.FieldError("body", "the body is not valid JSON")
	case errors.Is(err, io.EOF):
		return chargeonce.FieldError("body", "the body is empty")
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		name = strings.Trim(name, `"`)
		return chargeonce.FieldError(name, "unknown field %q", name)
	}
	return chargeonce.FieldError("body", "the body is not a valid capture request")
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "string"
	case "struct":
		return "object"
	default:
		return "integer"
	}
}

func (h *handler) get(w http.ResponseWriter, r *http.Request) {
	ref := r.PathValue("reference")
	c, ok := h.sim.Get(ref)
	if !ok {
		// A capture under way is waited for, as a repeated POST waits.
		lr, err := h.sim.Lookup(r.Context(), chargeonce.LookupRequest{Reference: ref})
		if err != nil {
			// Not "never seen": the capture is under way and its outcome
			// is not known yet.
			writeError(w, chargeonce.Errorf(chargeonce.EINPROGRESS, "the capture for reference %q is still under way", ref))
			return
		}
		c, ok = h.sim.Get(ref)
		if lr.Status == chargeonce.LookupFound && ok {
			writeJSON(w, http.StatusOK, c)
			return
		}
		writeError(w, chargeonce.Errorf(chargeonce.ENOTFOUND, "no capture for reference %q", ref))
		return
	}
	writeJSON(w, http.StatusOK, c)
}

func (h *handler) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	orderID, err := strconv.ParseInt(q.Get("order_id"), 10, 64)
	if err != nil || orderID <= 0 {
		writeError(w, chargeonce.FieldError("order_id", "the order_id query parameter must be a positive 64-bit integer"))
		return
	}
	merchant := q.Get("merchant")
	if merchant == "" {
		writeError(w, chargeonce.FieldError("merchant", "the merchant query parameter is required"))
		return
	}
	writeJSON(w, http.StatusOK, h.sim.ListByOrder(orderID, merchant))
}

func (h *handler) stats(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, h.sim.Stats())
}

func methodNotAllowed(allow string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", allow)
		writeError(w, chargeonce.Errorf(chargeonce.EMETHOD, "%s is not allowed on %s", r.Method, r.URL.Path))
	}
}

// problemStatus maps the error codes the simulator's API answers with to
// their HTTP status and title: the one place its errors become HTTP.
var problemStatus = map[string]struct {
	status int
	title  string
}{
	chargeonce.EINVALID:     {http.StatusBadRequest, "Validation failed"},
	chargeonce.EINVALIDKEY:  {http.StatusBadRequest, "Invalid Idempotency-Key"},
	chargeonce.ENOTFOUND:    {http.StatusNotFound, "Not found"},
	chargeonce.EINPROGRESS:  {http.StatusConflict, "Capture in progress"},
	chargeonce.EMETHOD:      {http.StatusMethodNotAllowed, "Method not allowed"},
	chargeonce.ETOOLARGE:    {http.StatusRequestEntityTooLarge, "Payload too large"},
	chargeonce.EUNAVAILABLE: {http.StatusServiceUnavailable, "Service unavailable"},
	chargeonce.EINTERNAL:    {http.StatusInternalServerError, "Internal error"},
	ETOOLATE:                {http.StatusUnprocessableEntity, "Request too late"},
}

// errorCode returns the code err is answered with. The fault tokens, a
// closed simulator and a caller that went away are all 503: the outcome is
// unknown to whoever reads the answer.
func errorCode(err error) string {
	switch {
	case errors.Is(err, ErrUnavailable), errors.Is(err, ErrClosed),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return chargeonce.EUNAVAILABLE
	case errors.Is(err, ErrTooLate):
		return ETOOLATE
	}
	return chargeonce.ErrorCode(err)
}

func writeError(w http.ResponseWriter, err error) {
	code := errorCode(err)
	info, ok := problemStatus[code]
	if !ok {
		code, info = chargeonce.EINTERNAL, problemStatus[chargeonce.EINTERNAL]
	}
	detail := chargeonce.ErrorMessage(err)
	if code == chargeonce.EUNAVAILABLE {
		// Simulator faults are not secrets: say which one struck.
		detail = err.Error()
	}
	var field string
	var e *chargeonce.Error
	if errors.As(err, &e) {
		field = e.Field
	}
	body, _ := json.Marshal(chargeonce.Problem{
		Type:   chargeonce.ProblemTypeBase + code,
		Title:  info.title,
		Status: info.status,
		Detail: detail,
		Field:  field,
	})
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(info.status)
	_, _ = w.Write(body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		writeError(w, fmt.Errorf("encoding response: %w", err))
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}
