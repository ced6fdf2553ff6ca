package acquirer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/chargeonce/chargeonce"
)

// The simulator's side of SPEC "Finality": a request lands whether or not
// its caller still waits, the simulator refuses one that lands past its
// acceptance window, and it can fence a reference so that nothing lands
// under it any more.

// DefaultAcceptanceWindow is how long after it was sent a request may
// still land at the simulator (`--acceptance-window`): later, it is
// refused and moves nothing.
const DefaultAcceptanceWindow = 30 * time.Second

// SentAtHeader carries when the Client sent a request (Unix nanoseconds),
// so that the simulator refuses one that a proxy held past the acceptance
// window. The two clocks are taken to agree to well under the window.
const SentAtHeader = "Chargeonce-Sent-At"

// ErrTooLate is matched by the error of a request that landed past the
// acceptance window or under a fenced reference: the simulator refused it
// and moved nothing. It also matches chargeonce.ErrCaptureRejected.
var ErrTooLate = errors.New("acquirer: the request arrived too late: past the acceptance window, or its reference is fenced")

// ETOOLATE is the problem type of a request refused by ErrTooLate: a 422,
// a definite refusal (Rejected).
const ETOOLATE = "request-too-late"

// AcceptanceWindow implements chargeonce.Finality.
func (s *Simulator) AcceptanceWindow() time.Duration { return s.window() }

func (s *Simulator) window() time.Duration {
	if s.opts.AcceptanceWindow > 0 {
		return s.opts.AcceptanceWindow
	}
	return DefaultAcceptanceWindow
}

var _ chargeonce.Fencer = (*Simulator)(nil)

// send carries a request to the simulator: it lands (land runs) after
// delay on a goroutine of its own, whether or not the caller still waits,
// as a request we gave up on may still reach a real acquirer. The caller
// gets land's answer, or ctx's error if it stops waiting first. Close cuts
// the delay short: the simulator finishes the requests it accepted.
func send[T any](ctx context.Context, s *Simulator, delay time.Duration, land func() (T, error)) (T, error) {
	var zero T
	if err := ctx.Err(); err != nil {
		// The request was never sent.
		return zero, err
	}
	type answer struct {
		v   T
		err error
	}
	done := make(chan answer, 1)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return zero, ErrClosed
	}
	// Added under s.mu while not closed, so it happens before Close's Wait.
	s.wg.Go(func() {
		s.wait(delay)
		v, err := land()
		done <- answer{v, err}
	})
	s.mu.Unlock()
	select {
	case a := <-done:
		return a.v, a.err
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}

// refuseLate is the refusal of a request for reference that lands under a
// fence, or past the acceptance window since it was sent. s.mu is held.
func (s *Simulator) refuseLate(reference string, fenced bool, sent time.Time) error {
	switch {
	case fenced:
		s.stats.LateRequests++
		return fmt.Errorf("%w: %w: reference %s is fenced", chargeonce.ErrCaptureRejected, ErrTooLate, reference)
	case time.Since(sent) > s.window():
		s.stats.LateRequests++
		return fmt.Errorf("%w: %w: reference %s was sent %s ago, past the acceptance window of %s",
			chargeonce.ErrCaptureRejected, ErrTooLate, reference, time.Since(sent).Round(time.Millisecond), s.window())
	}
	return nil
}

// arrivedLate refuses a capture or authorization request that a proxy held
// past the acceptance window since it was sent (a later one runs in
// process, where it lands as it arrives). A late request for a reference
// that settled or is under way joins it, as any repeat does: it moves
// nothing, and its answer must not say "refused" of money that moved.
func (s *Simulator) arrivedLate(reference string, sent time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ref := s.refs[reference]; ref != nil && (ref.capture != nil || ref.run != nil) {
		return nil
	}
	return s.refuseLate(reference, false, sent)
}

// Fence implements chargeonce.Fencer: it fences req.Reference, a
// charge's, a refund's or an operation's by req.Kind, unless something
// landed under it first. It answers LookupSafeToSend with Fenced when the
// reference held nothing (every later request for it is refused,
// ErrTooLate), LookupFound with what landed, and LookupUnsure while a
// charge's capture is under way. It moves no money.
func (s *Simulator) Fence(ctx context.Context, req chargeonce.LookupRequest) (chargeonce.LookupResult, error) {
	if err := ctx.Err(); err != nil {
		return chargeonce.LookupResult{}, err
	}
	if req.Reference == "" {
		return chargeonce.LookupResult{}, chargeonce.FieldError("reference", "a fence needs a reference")
	}
	fenced := chargeonce.LookupResult{Status: chargeonce.LookupSafeToSend, Fenced: true, Reason: "fenced at the acquirer: nothing can land under the reference any more"}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch req.Kind {
	case chargeonce.KindRefund:
		rr := s.refunds[req.Reference]
		if rr == nil {
			rr = &refundRef{}
			s.refunds[req.Reference] = rr
		}
		if rr.refund != nil {
			return chargeonce.LookupResult{Status: chargeonce.LookupFound, Refund: rr.refund.Result()}, nil
		}
		rr.fenced = true
	case chargeonce.KindCapture, chargeonce.KindCancel:
		or := s.ops[req.Reference]
		if or == nil {
			or = &opRef{}
			s.ops[req.Reference] = or
		}
		if or.op != nil {
			return chargeonce.LookupResult{Status: chargeonce.LookupFound, Operation: or.op.Result()}, nil
		}
		or.fenced = true
	default:
		ref := s.refs[req.Reference]
		switch {
		case ref == nil:
			ref = &reference{since: time.Now()}
			s.refs[req.Reference] = ref
		case ref.first != nil:
			return chargeonce.LookupResult{Status: chargeonce.LookupFound, Result: ref.first.Result()}, nil
		case ref.run != nil:
			return chargeonce.LookupResult{Reason: "a capture is under way under the reference: it cannot be fenced now"}, nil
		}
		ref.fenced = true
	}
	s.stats.Fences++
	return fenced, nil
}

// sentAt is when the request says its Client sent it (SentAtHeader), else
// now: a request without the header is taken to have been sent as it
// arrived.
func sentAt(r *http.Request) time.Time {
	if v := r.Header.Get(SentAtHeader); v != "" {
		if ns, err := strconv.ParseInt(v, 10, 64); err == nil && ns > 0 {
			if t := time.Unix(0, ns); t.Before(time.Now()) {
				return t
			}
		}
	}
	return time.Now()
}

// fenceRequest is the body of POST /v1/fences.
type fenceRequest struct {
	Reference string                `json:"reference"`
	Kind      chargeonce.RecordKind `json:"kind"`
}

// fence serves POST /v1/fences {"reference","kind"}: 200 with the lookup's
// answer (status "fenced", or "found" with what landed, or "unsure").
func (h *handler) fence(w http.ResponseWriter, r *http.Request) {
	var req fenceRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, decodeError(err))
		return
	}
	if !visibleASCII(req.Reference, MaxReferenceLen) {
		writeError(w, chargeonce.FieldError("reference", "reference must be 1 to %d visible ASCII characters", MaxReferenceLen))
		return
	}
	switch req.Kind {
	case chargeonce.KindCharge, chargeonce.KindRefund, chargeonce.KindCapture, chargeonce.KindCancel:
	default:
		writeError(w, chargeonce.FieldError("kind", "kind must be empty (a charge), refund, capture or cancel; got %q", req.Kind))
		return
	}
	lr, err := h.sim.Fence(r.Context(), chargeonce.LookupRequest{Reference: req.Reference, Kind: req.Kind})
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, fenceAnswerOf(lr))
}

// fenceAnswer is the answer of POST /v1/fences.
type fenceAnswer struct {
	Status    string                      `json:"status"` // fenced, found or unsure
	Reason    string                      `json:"reason,omitempty"`
	Capture   *chargeonce.CaptureResult   `json:"capture,omitempty"`
	Refund    *chargeonce.RefundResult    `json:"refund,omitempty"`
	Operation *chargeonce.OperationResult `json:"operation,omitempty"`
}

func fenceAnswerOf(lr chargeonce.LookupResult) fenceAnswer {
	a := fenceAnswer{Status: "unsure", Reason: lr.Reason}
	switch {
	case lr.Fenced:
		a.Status = "fenced"
	case lr.Status == chargeonce.LookupFound:
		a.Status = "found"
		switch {
		case lr.Refund.Reference != "":
			a.Refund = &lr.Refund
		case lr.Operation.Reference != "":
			a.Operation = &lr.Operation
		default:
			a.Capture = &lr.Result
		}
	}
	return a
}

// ClientFinality is the Client's chargeonce.Fencer: the remote simulator's
// fence (POST /v1/fences), and the acceptance window it was started with
// (its --acceptance-window), which the Client cannot ask.
type ClientFinality struct {
	Client *Client
	Window time.Duration
}

var _ chargeonce.Fencer = ClientFinality{}

// AcceptanceWindow implements chargeonce.Finality.
func (f ClientFinality) AcceptanceWindow() time.Duration {
	if f.Window > 0 {
		return f.Window
	}
	return DefaultAcceptanceWindow
}

// Fence implements chargeonce.Fencer over POST /v1/fences.
func (f ClientFinality) Fence(ctx context.Context, req chargeonce.LookupRequest) (chargeonce.LookupResult, error) {
	var a fenceAnswer
	if err := f.Client.post(ctx, "/v1/fences", "", fenceRequest{Reference: req.Reference, Kind: req.Kind}, &a); err != nil {
		return chargeonce.LookupResult{}, fmt.Errorf("acquirer: fencing %s: %w", req.Reference, err)
	}
	lr := chargeonce.LookupResult{Reason: a.Reason}
	switch {
	case a.Status == "fenced":
		lr.Status, lr.Fenced = chargeonce.LookupSafeToSend, true
	case a.Status == "found" && a.Refund != nil && a.Refund.Reference == req.Reference:
		lr.Status, lr.Refund = chargeonce.LookupFound, *a.Refund
	case a.Status == "found" && a.Operation != nil && a.Operation.Reference == req.Reference:
		lr.Status, lr.Operation = chargeonce.LookupFound, *a.Operation
	case a.Status == "found" && a.Capture != nil && a.Capture.Reference == req.Reference:
		lr.Status, lr.Result = chargeonce.LookupFound, *a.Capture
	case a.Status != "unsure":
		return chargeonce.LookupResult{}, fmt.Errorf("acquirer: fencing %s: unexpected answer %+v", req.Reference, a)
	}
	return lr, nil
}
