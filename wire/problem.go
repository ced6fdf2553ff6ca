package wire

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/chargeonce/chargeonce"
)

// ProblemInfo is how an error code is shown: the HTTP status and the
// problem's title. The queue publishes the same status and body the API
// answers, so the table lives here, below both adapters.
type ProblemInfo struct {
	Status int
	Title  string
}

// problems maps every error code to its status and title: the one table
// where the service's errors become answers.
var problems = map[string]ProblemInfo{
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
	chargeonce.EOVERLOADED:   {http.StatusServiceUnavailable, "Overloaded"},
	chargeonce.ERATELIMITED:  {http.StatusTooManyRequests, "Rate limited"},
	// Refunds: final answers about the charge's state, nothing kept.
	chargeonce.ENOTREFUNDABLE: {http.StatusBadRequest, "Charge not refundable"},
	chargeonce.EREFUNDEXCEEDS: {http.StatusBadRequest, "Refund exceeds captured amount"},
	// Captures and cancels of authorizations, likewise.
	chargeonce.ENOTAUTHORIZED:   {http.StatusBadRequest, "Charge not authorized"},
	chargeonce.ECAPTUREEXCEEDS:  {http.StatusBadRequest, "Capture exceeds authorized amount"},
	chargeonce.EOPERATIONFAILED: {http.StatusPaymentRequired, "Capture or cancel failed"},
	// The operators' API (package admin).
	chargeonce.ENOTPROCESSING: {http.StatusConflict, "Charge not processing"},
	chargeonce.EDISAGREES:     {http.StatusConflict, "Acquirer disagrees"},
	chargeonce.ELEASED:        {http.StatusConflict, "Charge in flight"},
	chargeonce.EUNSURE:        {http.StatusConflict, "Acquirer unsure"},
}

// ProblemFor returns err's code and how it is shown; codes without an entry
// are internal errors.
func ProblemFor(err error) (string, ProblemInfo) {
	code := chargeonce.ErrorCode(err)
	if info, ok := problems[code]; ok {
		return code, info
	}
	return chargeonce.EINTERNAL, problems[chargeonce.EINTERNAL]
}

// Problem returns the status and the exact application/problem+json body
// answered for err, with the request id requestID in it when not empty.
// The API answers it and the queue worker publishes the same bytes for the
// same mistake.
func Problem(err error, requestID string) (status int, body []byte) {
	code, info := ProblemFor(err)
	var field string
	if e := (*chargeonce.Error)(nil); errors.As(err, &e) {
		field = e.Field
	}
	body, _ = json.Marshal(chargeonce.Problem{
		Type:      chargeonce.ProblemTypeBase + code,
		Title:     info.Title,
		Status:    info.Status,
		Detail:    chargeonce.ErrorMessage(err),
		Field:     field,
		RequestID: requestID,
	})
	return info.Status, body
}
