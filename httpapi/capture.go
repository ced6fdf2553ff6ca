package httpapi

import (
	"net/http"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/wire"
)

// routeCapture adds the routes that settle an authorization (a charge with
// capture_method manual): its capture and its cancel (SPEC "Money going
// back").
func (s *Server) routeCapture() {
	s.mux.HandleFunc("POST /v1/charges/{id}/capture", s.handleOperation(chargeonce.KindCapture))
	s.mux.HandleFunc("/v1/charges/{id}/capture", s.methodNotAllowed)
	s.mux.HandleFunc("POST /v1/charges/{id}/cancel", s.handleOperation(chargeonce.KindCancel))
	s.mux.HandleFunc("/v1/charges/{id}/cancel", s.methodNotAllowed)
}

// cancelBody is the body of POST /v1/charges/{id}/cancel: nothing, or {}.
type cancelBody struct{}

// handleOperation runs one attempt of a capture or a cancel through the
// engine, with the charge protocol: Idempotency-Key required, 409 in
// flight, 422 on key reuse, the stored answer replayed byte for byte.
func (s *Server) handleOperation(kind chargeonce.RecordKind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		a, ok := s.readChargeAttempt(w, r)
		if !ok {
			return
		}
		if kind == chargeonce.KindCancel {
			if err := decodeOptional(a.body, &cancelBody{}); err != nil {
				s.writeError(w, r, err)
				return
			}
			resp, err := s.engine.Cancel(r.Context(), a.merchantID, a.chargeID, a.key)
			s.writeOperationAttempt(w, r, "cancel", resp, err)
			return
		}
		// An empty body captures the whole authorization, as {} does.
		req, err := wire.DecodeCaptureBody(a.body)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		resp, err := s.engine.Capture(r.Context(), a.merchantID, a.chargeID, a.key, &req)
		s.writeOperationAttempt(w, r, "capture", resp, err)
	}
}
