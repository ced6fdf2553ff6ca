package engine

import (
	"context"
	"fmt"
	"strconv"

	"github.com/chargeonce/chargeonce"
)

// Actors of the history entries the engine appends.
const (
	ActorAttempt  = "attempt"
	ActorRetry    = "retry"
	ActorRecovery = "recovery"
)

// trail collects what one drive of a record did at the acquirer, so that
// the unusual paths append it to the charge's history in one statement,
// and the common path (a first attempt with a definite answer) appends
// nothing.
type trail struct {
	// chargeID and merchantID, not the charge: a pointer to the caller's
	// charge would move it to the heap on every drive, the common path's
	// too.
	chargeID, merchantID string
	actor                string
	entries              []chargeonce.HistoryEntry
	// unusual is set when the drive is off the common path whatever its
	// outcome: a claim by recovery or by a retry, which looks first.
	unusual bool
}

func newTrail(ch *chargeonce.Charge, recovering, lookFirst bool, attempts int) trail {
	t := trail{chargeID: ch.ID, merchantID: ch.MerchantID, actor: ActorAttempt}
	switch {
	case recovering:
		t.actor, t.unusual = ActorRecovery, true
	case lookFirst:
		t.actor, t.unusual = ActorRetry, true
	}
	if t.unusual {
		t.add(chargeonce.HistoryRecoveryClaim, "claimed", "failed attempts so far: "+strconv.Itoa(attempts))
	}
	return t
}

func (t *trail) add(kind chargeonce.HistoryKind, outcome, detail string) {
	t.entries = append(t.entries, chargeonce.HistoryEntry{
		ChargeID: t.chargeID, MerchantID: t.merchantID, Kind: kind, Actor: t.actor, Outcome: outcome, Detail: detail,
	})
}

func (t *trail) lookup(lr chargeonce.LookupResult, err error) {
	if err != nil {
		t.add(chargeonce.HistoryLookup, "error", err.Error())
		return
	}
	t.add(chargeonce.HistoryLookup, LookupOutcome(lr), lr.Reason)
}

func (t *trail) capture(res chargeonce.CaptureResult, err error) {
	if err != nil {
		t.add(chargeonce.HistoryCapture, "error", err.Error())
		return
	}
	outcome := string(res.Status)
	if res.DeclineCode != "" {
		outcome += " (" + res.DeclineCode + ")"
	}
	t.add(chargeonce.HistoryCapture, outcome, "")
}

// LookupOutcome says in a few words what a lookup found: "found: captured",
// "found: declined (code)", "safe-to-send" or "unsure".
func LookupOutcome(lr chargeonce.LookupResult) string {
	if lr.Status != chargeonce.LookupFound {
		return lr.Status.String()
	}
	s := fmt.Sprintf("found: %s", lr.Result.Status)
	if lr.Result.DeclineCode != "" {
		s += " (" + lr.Result.DeclineCode + ")"
	}
	return s
}

// startTrail begins the trail of a drive of ch's record. A drive off the
// common path (a claim by recovery, or by a retry past an expired lease)
// appends its claim at once, before it calls the acquirer, so that a drive
// killed mid-call (its process SIGKILLed) still leaves its mark: a claim
// with nothing after it is a lookup, and perhaps a capture, sent with no
// answer stored (admin.Timeline shows it so). The rest of the trail is
// appended when the drive ends. The common path, a first attempt, appends
// nothing here: its record's insert is its claim.
func (e *Engine) startTrail(base context.Context, ch *chargeonce.Charge, recovering, lookFirst bool, attempts int) trail {
	t := newTrail(ch, recovering, lookFirst, attempts)
	if t.unusual {
		e.appendHistory(base, &t, false)
		t.entries = t.entries[:0]
	}
	return t
}

// appendHistory writes the trail of a drive that left the common path: a
// claim, or an outcome that stayed unknown. Best effort and bounded: the
// history informs operators, and a failed write must not hold the
// settlement back.
func (e *Engine) appendHistory(base context.Context, tr *trail, unknown bool) {
	if e.opts.History == nil || len(tr.entries) == 0 || (!tr.unusual && !unknown) {
		return
	}
	wctx, cancel := context.WithTimeout(base, e.opts.WriteTimeout)
	defer cancel()
	if err := e.opts.History.HistoryAppend(wctx, tr.entries...); err != nil {
		e.log.Warn("appending charge history failed", "charge_id", tr.chargeID, "err", err)
	}
}
