package stripetest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Refund is the fake's record of one Refund.
type Refund struct {
	ID            string            `json:"id"`
	Object        string            `json:"object"`
	Amount        int64             `json:"amount"`
	Currency      string            `json:"currency"`
	Status        string            `json:"status"`
	PaymentIntent string            `json:"payment_intent"`
	Metadata      map[string]string `json:"metadata"`
	Created       int64             `json:"created"`
	createdAt     time.Time
}

// createRefund answers POST /v1/refunds: a Refund of a succeeded
// PaymentIntent, of its remaining amount by default and never of more, with
// Idempotency-Key replay and the faults of the PaymentIntent's payment
// method.
func (f *Fake) createRefund(w http.ResponseWriter, r *http.Request) {
	form := r.PostForm
	key := r.Header.Get("Idempotency-Key")
	params := "refund:" + form.Encode()
	now := time.Now()
	ref := form.Get("metadata[chargeonce_refund_reference]")

	f.mu.Lock()
	pi, pm := f.intentLocked(form.Get("payment_intent"))
	faulty := f.faultyLocked("refund:"+ref, now)
	if key != "" && f.keyAnsweredLocked(w, key, params, pm, faulty, now) {
		return
	}
	if faulty && pm == PMFailBefore {
		f.mu.Unlock()
		writeError(w, http.StatusInternalServerError, apiError{Type: "api_error", Message: "injected fault before commit"})
		return
	}
	status, answer := f.refundLocked(form.Get("amount"), pi, form.Get("payment_intent"), now)
	if rf, ok := answer.(*Refund); ok {
		for k, v := range form {
			if name, ok := strings.CutPrefix(k, "metadata["); ok {
				rf.Metadata[strings.TrimSuffix(name, "]")] = v[0]
			}
		}
		cp := *rf
		answer = &cp
	}
	f.answerLocked(w, key, params, pm, faulty, status, answer, now)
}

// refundLocked creates a Refund of pi (id as asked), or says why not.
// f.mu is held.
func (f *Fake) refundLocked(amountText string, pi *PaymentIntent, id string, now time.Time) (int, any) {
	invalid := func(code, param, msg string) (int, any) {
		return http.StatusBadRequest, map[string]any{"error": apiError{Type: "invalid_request_error", Code: code, Param: param, Message: msg}}
	}
	if pi == nil {
		return invalid("resource_missing", "payment_intent", fmt.Sprintf("No such payment_intent: '%s'", id))
	}
	f.settle(pi, now)
	if pi.Status != "succeeded" {
		return invalid("charge_not_refundable", "payment_intent", "This PaymentIntent does not have a successful charge to refund.")
	}
	remaining := received(pi) - f.refundedLocked(pi.ID)
	amount := remaining
	if amountText != "" {
		n, err := strconv.ParseInt(amountText, 10, 64)
		if err != nil || n <= 0 {
			return invalid("parameter_invalid_integer", "amount", "Invalid positive integer")
		}
		amount = n
	}
	if remaining <= 0 {
		return invalid("charge_already_refunded", "", fmt.Sprintf("Charge of PaymentIntent %s has already been refunded.", pi.ID))
	}
	if amount > remaining {
		return invalid("amount_too_large", "amount", fmt.Sprintf("Refund amount (%d) is greater than unrefunded amount on charge (%d)", amount, remaining))
	}
	rf := &Refund{
		ID:            fmt.Sprintf("re_fake%06d", len(f.refunds)+1),
		Object:        "refund",
		Amount:        amount,
		Currency:      pi.Currency,
		Status:        "succeeded",
		PaymentIntent: pi.ID,
		Metadata:      map[string]string{},
		Created:       now.Unix(),
		createdAt:     now,
	}
	if pi.PaymentMethod == PMRefundPending {
		rf.Status = "pending"
	}
	f.refunds = append(f.refunds, rf)
	return http.StatusOK, rf
}

// refundedLocked is what the Refunds of PaymentIntent id hold back:
// succeeded and pending ones. f.mu is held.
func (f *Fake) refundedLocked(id string) int64 {
	var n int64
	for _, rf := range f.refunds {
		if rf.PaymentIntent == id && (rf.Status == "succeeded" || rf.Status == "pending") {
			n += rf.Amount
		}
	}
	return n
}

// settleRefund moves a pending Refund on once Options.Processing has
// passed. f.mu is held.
func (f *Fake) settleRefund(rf *Refund, now time.Time) {
	if rf.Status == "pending" && f.opts.Processing > 0 && now.Sub(rf.createdAt) >= f.opts.Processing {
		rf.Status = "succeeded"
	}
}

// listRefunds answers GET /v1/refunds?payment_intent=…: every Refund of
// the PaymentIntent (all of them when none is named), newest first, on one
// page. Unlike Search, the list is consistent.
func (f *Fake) listRefunds(w http.ResponseWriter, r *http.Request) {
	pi := r.Form.Get("payment_intent")
	now := time.Now()
	f.mu.Lock()
	data := []*Refund{}
	for i := len(f.refunds) - 1; i >= 0; i-- {
		rf := f.refunds[i]
		if pi == "" || rf.PaymentIntent == pi {
			f.settleRefund(rf, now)
			cp := *rf
			data = append(data, &cp)
		}
	}
	f.mu.Unlock()
	body, _ := json.Marshal(map[string]any{"object": "list", "url": "/v1/refunds", "has_more": false, "data": data})
	writeRaw(w, http.StatusOK, body)
}

// retrieveRefund answers GET /v1/refunds/{id}.
func (f *Fake) retrieveRefund(w http.ResponseWriter, id string) {
	now := time.Now()
	f.mu.Lock()
	var found *Refund
	for _, rf := range f.refunds {
		if rf.ID == id {
			f.settleRefund(rf, now)
			cp := *rf
			found = &cp
		}
	}
	f.mu.Unlock()
	if found == nil {
		writeError(w, http.StatusNotFound, apiError{Type: "invalid_request_error", Code: "resource_missing", Param: "id",
			Message: fmt.Sprintf("No such refund: '%s'", id)})
		return
	}
	body, _ := json.Marshal(found)
	writeRaw(w, http.StatusOK, body)
}

// Refunds returns every Refund created, oldest first.
func (f *Fake) Refunds() []Refund {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	out := make([]Refund, len(f.refunds))
	for i, rf := range f.refunds {
		f.settleRefund(rf, now)
		out[i] = *rf
	}
	return out
}

// RefundedCents returns how much the PaymentIntents of a chargeonce
// reference had refunded (succeeded and pending Refunds), in Stripe's
// units: more than was captured is an over-refund.
func (f *Fake) RefundedCents(chargeRef string) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	var n int64
	for _, pi := range f.intents {
		if pi.Metadata["chargeonce_reference"] == chargeRef {
			n += f.refundedLocked(pi.ID)
		}
	}
	return n
}

// RefundsOf returns how many Refunds carry a refund reference: more than
// one is money moved back twice.
func (f *Fake) RefundsOf(refundRef string) int {
	n := 0
	for _, rf := range f.Refunds() {
		if rf.Metadata["chargeonce_refund_reference"] == refundRef {
			n++
		}
	}
	return n
}
