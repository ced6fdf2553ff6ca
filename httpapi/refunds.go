package httpapi

import (
	"context"
	"net/http"
	"strconv"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/idempotency"
	"github.com/chargeonce/chargeonce/wire"
)

// routeRefunds adds the refunds' routes (SPEC "Money going back").
func (s *Server) routeRefunds() {
	s.mux.HandleFunc("POST /v1/charges/{id}/refunds", s.handleCreateRefund)
	s.mux.HandleFunc("/v1/charges/{id}/refunds", s.methodNotAllowed)
	s.mux.HandleFunc("GET /v1/refunds", s.handleListRefunds)
	s.mux.HandleFunc("GET /v1/refunds/{id}", s.handleGetRefund)
	s.mux.HandleFunc("/v1/refunds", s.methodNotAllowed)
	s.mux.HandleFunc("/v1/refunds/{id}", s.methodNotAllowed)
}

// handleCreateRefund runs one attempt of a refund through the engine, with
// the charge protocol: Idempotency-Key required, 409 in flight, 422 on key
// reuse, the stored answer replayed byte for byte.
func (s *Server) handleCreateRefund(w http.ResponseWriter, r *http.Request) {
	a, ok := s.readChargeAttempt(w, r)
	if !ok {
		return
	}
	// An empty body refunds what remains, as {} does.
	req, err := wire.DecodeRefundRequest(a.body)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	resp, err := s.engine.Refund(r.Context(), a.merchantID, a.chargeID, a.key, &req)
	s.writeOperationAttempt(w, r, "refund", resp, err)
}

// chargeAttempt is what every money operation on a charge (a refund, a
// capture, a cancel) reads from its request before its own body.
type chargeAttempt struct {
	merchantID, chargeID, key string
	body                      []byte
}

// readChargeAttempt authenticates r, checks the charge id in its path and
// its Idempotency-Key, and reads its body within the merchant's share; on
// failure it has answered the problem and ok is false.
func (s *Server) readChargeAttempt(w http.ResponseWriter, r *http.Request) (a chargeAttempt, ok bool) {
	merchant, err := s.keys.authenticate(r)
	if err != nil {
		s.writeError(w, r, err)
		return a, false
	}
	a.merchantID, a.chargeID = merchant.ID, r.PathValue("id")
	if !plausibleChargeID(a.chargeID) {
		s.writeError(w, r, chargeonce.Errorf(chargeonce.ENOTFOUND, "no charge has that id: ids are visible ASCII"))
		return a, false
	}
	if a.key, err = idempotency.ParseKey(r.Header.Values("Idempotency-Key")); err != nil {
		s.writeError(w, r, err)
		return a, false
	}
	if a.body, err = s.readMerchantBody(w, r, merchant.ID); err != nil {
		s.writeError(w, r, err)
		return a, false
	}
	return a, true
}

// decodeOptional decodes body strictly into v; an empty body leaves v as
// it is, as {} would.
func decodeOptional(body []byte, v any) error {
	if len(body) == 0 {
		return nil
	}
	return wire.Decode(body, v)
}

func (s *Server) handleGetRefund(w http.ResponseWriter, r *http.Request) {
	s.getOne(w, r, "refund", func(ctx context.Context, merchantID, id string) ([]byte, error) {
		rf, err := s.store.RefundGet(ctx, merchantID, id)
		return engine.EncodeRefund(&rf), err
	})
}

// handleListRefunds answers one page of the merchant's refunds, newest
// first, optionally of one charge:
//
//	{"object":"list","data":[…],"has_more":true,"url":"/v1/refunds"}
func (s *Server) handleListRefunds(w http.ResponseWriter, r *http.Request) {
	merchant, err := s.keys.authenticate(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	p, err := parseRefundsQuery(r.URL.RawQuery)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	p.MerchantID = merchant.ID
	page, err := s.store.RefundsList(r.Context(), p)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	b := append(make([]byte, 0, 96+256*len(page.Refunds)), `{"object":"list","data":[`...)
	for i := range page.Refunds {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, engine.EncodeRefund(&page.Refunds[i])...)
	}
	b = append(b, `],"has_more":`...)
	b = strconv.AppendBool(b, page.HasMore)
	b = append(b, `,"url":"/v1/refunds"}`...)
	writeJSON(w, http.StatusOK, b)
}

// refundsParams are the query parameters GET /v1/refunds understands.
var refundsParams = map[string]bool{"limit": true, "starting_after": true, "charge_id": true}

// parseRefundsQuery reads GET /v1/refunds' query strictly: limit,
// starting_after and charge_id, each at most once and not empty.
func parseRefundsQuery(raw string) (chargeonce.RefundsListParams, error) {
	p := chargeonce.RefundsListParams{Limit: chargeonce.RefundsListDefaultLimit}
	q, limit, err := listQuery(raw, refundsParams, "GET /v1/refunds takes limit, starting_after and charge_id", chargeonce.RefundsListMaxLimit)
	if err != nil {
		return p, err
	}
	if limit > 0 {
		p.Limit = limit
	}
	p.ChargeID = q.Get("charge_id")
	p.StartingAfter = q.Get("starting_after")
	return p, nil
}
