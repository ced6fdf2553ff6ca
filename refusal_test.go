package chargeonce_test

import (
	"errors"
	"testing"

	"github.com/chargeonce/chargeonce"
)

// TestRefundRefusal is the refund rule's table: which refunds of a charge
// both stores insert, and what the others are told.
func TestRefundRefusal(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		asked     int64
		status    chargeonce.Status
		remaining int64
		code      string // "" admits the refund
		message   string
	}{
		{"part of what remains", 400, chargeonce.StatusCaptured, 1000, "", ""},
		{"all that remains", 1000, chargeonce.StatusCaptured, 1000, "", ""},
		{"the rest, unnamed", 0, chargeonce.StatusCaptured, 1, "", ""},
		{"more than remains", 1001, chargeonce.StatusCaptured, 1000, chargeonce.EREFUNDEXCEEDS,
			"amount_cents 1001 exceeds what remains refundable on charge ch_1: remaining amount_cents is 1000 usd"},
		{"the rest of nothing", 0, chargeonce.StatusCaptured, 0, chargeonce.EREFUNDEXCEEDS,
			"charge ch_1 has nothing left to refund: remaining amount_cents is 0 usd"},
		{"an amount of nothing", 1, chargeonce.StatusCaptured, 0, chargeonce.EREFUNDEXCEEDS,
			"amount_cents 1 exceeds what remains refundable on charge ch_1: remaining amount_cents is 0 usd"},
		{"authorized, not captured", 100, chargeonce.StatusAuthorized, 1000, chargeonce.ENOTREFUNDABLE,
			"charge ch_1 is authorized; only a captured charge can be refunded"},
		{"declined", 100, chargeonce.StatusDeclined, 1000, chargeonce.ENOTREFUNDABLE,
			"charge ch_1 is declined; only a captured charge can be refunded"},
		{"processing", 0, chargeonce.StatusProcessing, 0, chargeonce.ENOTREFUNDABLE,
			"charge ch_1 is processing; only a captured charge can be refunded"},
		{"canceled", 100, chargeonce.StatusCanceled, 1000, chargeonce.ENOTREFUNDABLE,
			"charge ch_1 is canceled; only a captured charge can be refunded"},
	} {
		err := chargeonce.RefundRefusal("ch_1", c.asked, c.status, c.remaining, "usd")
		checkRefusal(t, c.name, err, c.code, c.message)
	}
}

// TestOperationRefusal is the capture and cancel rule's table: which
// operations of a charge both stores insert, and what the others are told.
func TestOperationRefusal(t *testing.T) {
	t.Parallel()
	const (
		capture = chargeonce.KindCapture
		cancel  = chargeonce.KindCancel
	)
	for _, c := range []struct {
		name    string
		kind    chargeonce.RecordKind
		asked   int64
		status  chargeonce.Status
		live    chargeonce.RecordKind
		code    string // "" admits the operation
		message string
	}{
		{"a partial capture", capture, 600, chargeonce.StatusAuthorized, "", "", ""},
		{"the whole, named", capture, 1000, chargeonce.StatusAuthorized, "", "", ""},
		{"the whole, unnamed", capture, 0, chargeonce.StatusAuthorized, "", "", ""},
		{"a cancel", cancel, 0, chargeonce.StatusAuthorized, "", "", ""},
		{"past the authorization", capture, 1001, chargeonce.StatusAuthorized, "", chargeonce.ECAPTUREEXCEEDS,
			"amount_cents 1001 exceeds what charge ch_1 authorized: 1000 usd"},
		{"a capture held by a capture", capture, 0, chargeonce.StatusAuthorized, capture, chargeonce.ENOTAUTHORIZED,
			"charge ch_1 already has a capture in progress or done; it cannot be captured"},
		{"a cancel held by a capture", cancel, 0, chargeonce.StatusCaptured, capture, chargeonce.ENOTAUTHORIZED,
			"charge ch_1 already has a capture in progress or done; it cannot be canceled"},
		{"held before past", capture, 5000, chargeonce.StatusAuthorized, cancel, chargeonce.ENOTAUTHORIZED,
			"charge ch_1 already has a cancel in progress or done; it cannot be captured"},
		{"captured automatically", capture, 0, chargeonce.StatusCaptured, "", chargeonce.ENOTAUTHORIZED,
			"charge ch_1 is captured; only an authorized charge (capture_method manual) can be captured"},
		{"not authorized before past", capture, 5000, chargeonce.StatusDeclined, "", chargeonce.ENOTAUTHORIZED,
			"charge ch_1 is declined; only an authorized charge (capture_method manual) can be captured"},
		{"a canceled charge", cancel, 0, chargeonce.StatusCanceled, "", chargeonce.ENOTAUTHORIZED,
			"charge ch_1 is canceled; only an authorized charge (capture_method manual) can be canceled"},
	} {
		err := chargeonce.OperationRefusal("ch_1", c.kind, c.asked, c.status, 1000, "usd", c.live)
		checkRefusal(t, c.name, err, c.code, c.message)
	}
}

// checkRefusal checks a rule's answer: nil when code is "", else an error
// of code saying message.
func checkRefusal(t *testing.T, name string, err error, code, message string) {
	t.Helper()
	if code == "" {
		if err != nil {
			t.Errorf("%s: refused with %v, want admitted", name, err)
		}
		return
	}
	var e *chargeonce.Error
	if !errors.As(err, &e) {
		t.Errorf("%s: got %v, want %s", name, err, code)
		return
	}
	if e.Code != code || e.Message != message {
		t.Errorf("%s: got %s %q, want %s %q", name, e.Code, e.Message, code, message)
	}
}
