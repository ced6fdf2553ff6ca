package httpapi

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/chargeonce/chargeonce"
)

// problemInfo is how an error code is shown over HTTP.
type problemInfo struct {
	status int
	title  string
}

// problems maps every error code to its status and title: the one table
// where the service's errors become HTTP.
var problems = map[string]problemInfo{
	chargeonce.EINVALID:      {http.StatusBadRequest, "Validation failed"},
	chargeonce.EMISSINGKEY:   {http.StatusBadRequest, "Missing Idempotency-Key"},
	chargeonce.EINVALIDKEY:   {http.StatusBadRequest, "Invalid Idempotency-Key"},
	chargeonce.EUNAUTHORIZED: {http.StatusUnauthorized, "Unauthorized"},
	chargeonce.ENOTFOUND:     {http.StatusNotFound, "Not found"},
	chargeonce.EMETHOD:       {http.StatusMethodNotAllowed, "Method not allowed"},
	chargeonce.EINPROGRESS:   {http.StatusConflict, "Request in progress"},
	chargeonce.ETOOLARGE:     {http.StatusRequestEntityTooLarge, "Payload too large"},
	chargeonce.EKEYREUSED:    {http.StatusUnprocessableEntity, "Idempotency-Key reused"},
	chargeonce.EDECLINED:     {http.StatusPaymentRequired, "Card declined"},
	chargeonce.EUNAVAILABLE:  {http.StatusServiceUnavailable, "Service unavailable"},
	chargeonce.EINTERNAL:     {http.StatusInternalServerError, "Internal error"},
}

// retryAfterSeconds is sent with 409: the attempt holding the key normally
// finishes within the acquirer timeout, so a prompt retry usually replays.
const retryAfterSeconds = "1"

// problemFor returns err's code and how it is shown; codes without an entry
// are internal errors.
func problemFor(err error) (string, problemInfo) {
	code := chargeonce.ErrorCode(err)
	if info, ok := problems[code]; ok {
		return code, info
	}
	return chargeonce.EINTERNAL, problems[chargeonce.EINTERNAL]
}

// Problem returns the status and the exact application/problem+json body
// the API answers for err. The queue worker publishes the same bytes for the
// same mistake.
func Problem(err error) (status int, body []byte) {
	code, info := problemFor(err)
	var field string
	if e := (*chargeonce.Error)(nil); errors.As(err, &e) {
		field = e.Field
	}
	body, _ = json.Marshal(chargeonce.Problem{
		Type:   chargeonce.ProblemTypeBase + code,
		Title:  info.title,
		Status: info.status,
		Detail: chargeonce.ErrorMessage(err),
		Field:  field,
	})
	return info.status, body
}

// writeError writes err as application/problem+json.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	code, _ := problemFor(err)
	noteCode(r, code)
	status, body := Problem(err)
	if status >= 500 {
		s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	if code == chargeonce.EINPROGRESS {
		h.Set("Retry-After", retryAfterSeconds)
	}
	if code == chargeonce.EUNAUTHORIZED {
		h.Set("WWW-Authenticate", `Bearer realm="chargeonce"`)
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
