package httpapi

import (
	"net/http"
	"net/url"
	"strconv"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/engine"
)

// listParams are the query parameters GET /v1/charges understands. Any
// other is a 400 naming it: a misspelt filter (orderid=7) must not quietly
// list every charge.
var listParams = map[string]bool{
	"limit": true, "starting_after": true, "ending_before": true, "order_id": true, "status": true,
}

// handleListCharges answers one page of the merchant's charges, newest
// first, as a list object (SPEC "GET /v1/charges"):
//
//	{"object":"list","data":[…],"has_more":true,"url":"/v1/charges"}
//
// No request reads or returns more than one page, whatever the merchant has
// stored; the store's keyset queries see to the reading.
func (s *Server) handleListCharges(w http.ResponseWriter, r *http.Request) {
	merchant, err := s.keys.authenticate(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	p, err := parseListQuery(r.URL.RawQuery)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	p.MerchantID = merchant.ID
	page, err := s.store.ChargesList(r.Context(), p)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	b := append(make([]byte, 0, 96+256*len(page.Charges)), `{"object":"list","data":[`...)
	for i := range page.Charges {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, engine.EncodeCharge(&page.Charges[i])...)
	}
	b = append(b, `],"has_more":`...)
	b = strconv.AppendBool(b, page.HasMore)
	b = append(b, `,"url":"/v1/charges"}`...)
	writeJSON(w, http.StatusOK, b)
}

// parseListQuery reads the query of GET /v1/charges strictly: a parameter
// it does not know, one given twice or empty, a limit or an order_id that
// is not a number in range, are EINVALID errors naming the parameter. The
// cursors and the status are checked by the store (ChargesListParams.Check,
// and whether a cursor is one of the merchant's charges).
func parseListQuery(raw string) (chargeonce.ChargesListParams, error) {
	p := chargeonce.ChargesListParams{Limit: chargeonce.ChargesListDefaultLimit}
	q, limit, err := listQuery(raw, listParams, "GET /v1/charges takes limit, starting_after, ending_before, order_id and status", chargeonce.ChargesListMaxLimit)
	if err != nil {
		return p, err
	}
	if limit > 0 {
		p.Limit = limit
	}
	if v, ok := q["order_id"]; ok {
		n, err := strconv.ParseInt(v[0], 10, 64)
		if err != nil || n <= 0 {
			return p, chargeonce.FieldError("order_id", "the order_id query parameter must be a positive 64-bit integer")
		}
		p.OrderID = n
	}
	p.Status = chargeonce.Status(q.Get("status"))
	p.StartingAfter = q.Get("starting_after")
	p.EndingBefore = q.Get("ending_before")
	return p, nil
}

// listQuery reads a list route's query strictly: a parameter not in
// allowed (takes says which the route takes), one given twice or empty, or
// a limit that is not an integer from 1 to maxLimit, is an EINVALID error
// naming the parameter. It returns the parameters and the limit (0 when
// none is given).
func listQuery(raw string, allowed map[string]bool, takes string, maxLimit int) (url.Values, int, error) {
	q, err := url.ParseQuery(raw)
	if err != nil {
		return nil, 0, chargeonce.Errorf(chargeonce.EINVALID, "the query string is malformed: %v", err)
	}
	for name, vs := range q {
		if !allowed[name] {
			field := name
			if !chargeonce.ValidText(field) || len(field) > 64 {
				field = "query"
			}
			return nil, 0, chargeonce.FieldError(field, "unknown query parameter %q; %s", name, takes)
		}
		if len(vs) > 1 {
			return nil, 0, chargeonce.FieldError(name, "%s is given %d times; give it once", name, len(vs))
		}
		if vs[0] == "" || !chargeonce.ValidText(vs[0]) {
			return nil, 0, chargeonce.FieldError(name, "%s is empty or not text; give a value or leave it out", name)
		}
	}
	limit := 0
	if v, ok := q["limit"]; ok {
		n, err := strconv.Atoi(v[0])
		if err != nil || n < 1 || n > maxLimit {
			return nil, 0, chargeonce.FieldError("limit", "limit must be an integer from 1 to %d", maxLimit)
		}
		limit = n
	}
	return q, limit, nil
}
