package chargeonce

import (
	"context"
	"fmt"
	"time"
)

// Finality (SPEC v5 "Finality: what the acquirer has not seen, it may still
// see"). A request we gave up on may still reach the acquirer later: held
// by a proxy, queued in a load balancer, retried by the adapter's own
// client. An acquirer's "never seen" for a reference is therefore final
// only when nothing can still land: its acceptance window has passed since
// our last request for the reference, or the reference is fenced at the
// acquirer, so that a late arrival is refused. Until then nobody records a
// negative outcome (declined, failed, canceled) on it. The rule is written
// here once, as a pure function (Judge), and every path that settles an
// outcome the acquirer did not give (an operator's resolution, of any
// kind) asks it.

// DefaultAcceptanceWindow is the acceptance window assumed of an acquirer
// whose adapter states none: a day, longer than any client's timeout and
// retries, so that an adapter that forgets to say never lets a "no" be
// recorded early. Fencing makes a "no" final at once.
const DefaultAcceptanceWindow = 24 * time.Hour

// Finality is what an acquirer's adapter promises about requests that
// arrive late. It is passed explicitly where outcomes are settled (the
// operators' resolution), never found by type assertion on an Acquirer,
// so that no wrapper can drop it.
type Finality interface {
	// AcceptanceWindow is how long after we last sent a request for a
	// reference that request may still land at the acquirer. After it,
	// the acquirer's "never seen" is final.
	AcceptanceWindow() time.Duration
}

// Fencer is a Finality that can also fence a reference: after Fence, the
// acquirer refuses every request for the reference, so its "never seen"
// is final at once.
type Fencer interface {
	Finality
	// Fence fences req.Reference (of the record kind req.Kind) and answers
	// what the acquirer holds under it, as a lookup does: LookupSafeToSend
	// when it held nothing and is now fenced (Fenced set), LookupFound
	// when a request landed first (it is not fenced: the outcome stands),
	// LookupUnsure when a request is under way and the fence could not be
	// set. An error means it could not be asked.
	Fence(ctx context.Context, req LookupRequest) (LookupResult, error)
}

// WindowOf is f's acceptance window, or DefaultAcceptanceWindow when f is
// nil or states none.
func WindowOf(f Finality) time.Duration {
	if f == nil {
		return DefaultAcceptanceWindow
	}
	if w := f.AcceptanceWindow(); w > 0 {
		return w
	}
	return DefaultAcceptanceWindow
}

// Seen is what a lookup says of a reference, in the terms the rule reads:
// whether anything landed, and whether what landed moved money (or, for
// a void, released it: the request took effect).
type Seen int

// The answers a lookup gives, normalized for Judge.
const (
	// SeenUnknown: the lookup failed or could not tell.
	SeenUnknown Seen = iota
	// SeenOpen: the acquirer's object may still move money (a
	// PaymentIntent processing or awaiting capture).
	SeenOpen
	// SeenNever: the acquirer holds nothing under the reference.
	SeenNever
	// SeenNoEffect: a request landed and took no effect (declined,
	// failed).
	SeenNoEffect
	// SeenEffect: a request landed and took effect (captured, authorized,
	// refunded, voided).
	SeenEffect
)

// Judgement is what Judge weighs: an outcome decided by somebody other
// than the acquirer, against what the acquirer said.
type Judgement struct {
	// Effect says the decided outcome is that the request took effect
	// (captured, authorized, succeeded); false is a negative outcome
	// (declined, failed, canceled).
	Effect bool
	// Force is the operator's override of an unsure or contradicting
	// answer. It never overrides money the acquirer says moved.
	Force bool
	// Seen is the lookup's answer; Matches says a found outcome is the
	// decided one; Binding that the acquirer's own state rules out any
	// other (LookupResult.Binding).
	Seen    Seen
	Matches bool
	Binding bool
	// Fenced says the reference is fenced at the acquirer: nothing can
	// land any more.
	Fenced bool
	// Quiet is how long nothing has been sent for the reference, by the
	// database's clock (KeyRecord.Quiet); Window the acquirer's acceptance
	// window.
	Quiet, Window time.Duration
}

// Verdict is Judge's answer.
type Verdict struct {
	// Settle says the outcome may be recorded; Forced that only force let
	// it be.
	Settle, Forced bool
	// Code is why not (EUNSURE, EDISAGREES), or why force was needed;
	// Binds that force cannot override it.
	Code  string
	Binds bool
	// RetryAfter is when asking again may settle it (EUNSURE within the
	// window).
	RetryAfter time.Duration
	// Why says it in a clause, for messages and the audit trail.
	Why string
}

// Judge decides whether an outcome somebody other than the acquirer
// decided may be recorded, for every kind of record alike (SPEC
// "Finality"):
//   - money the acquirer says moved (or may still move) is never recorded
//     as no money moved, even forced;
//   - an outcome the lookup contradicts, or a positive outcome on a
//     reference the acquirer never saw, needs force;
//   - a negative outcome on a reference the acquirer never saw is final
//     only once fenced or after the acceptance window since our last
//     request; until then it is EUNSURE with RetryAfter, and force
//     overrides it (audited);
//   - a lookup that failed or could not tell needs force.
func Judge(j Judgement) Verdict {
	v := judge(j)
	if !v.Settle && !v.Binds && j.Force {
		v.Settle, v.Forced = true, true
	}
	return v
}

func judge(j Judgement) Verdict {
	switch j.Seen {
	case SeenOpen:
		if !j.Effect {
			return Verdict{Code: EDISAGREES, Binds: true, Why: "the acquirer's object may still move money, so it cannot be settled as moving none"}
		}
		return Verdict{Code: EUNSURE, Why: "the acquirer's object is still open"}
	case SeenEffect:
		switch {
		case j.Matches:
			return Verdict{Settle: true}
		case !j.Effect:
			return Verdict{Code: EDISAGREES, Binds: true, Why: "the acquirer says the request took effect (money moved), which no one may settle as moving none"}
		}
		return Verdict{Code: EDISAGREES, Binds: j.Binding, Why: "the acquirer holds another outcome"}
	case SeenNoEffect:
		if j.Matches {
			return Verdict{Settle: true}
		}
		return Verdict{Code: EDISAGREES, Binds: j.Binding, Why: "the acquirer says the request took no effect"}
	case SeenNever:
		switch {
		case j.Effect:
			return Verdict{Code: EDISAGREES, Why: "the acquirer holds nothing under the reference, which contradicts an outcome that moved money"}
		case j.Fenced:
			return Verdict{Settle: true, Why: "the reference is fenced at the acquirer: nothing can land any more"}
		case j.Quiet >= j.Window:
			return Verdict{Settle: true, Why: fmt.Sprintf("nothing was sent for %s, past the acquirer's acceptance window of %s", j.Quiet.Round(time.Second), j.Window)}
		}
		wait := max(j.Window-j.Quiet, time.Second)
		return Verdict{Code: EUNSURE, RetryAfter: wait,
			Why: fmt.Sprintf("the acquirer has not seen the reference, but a request sent %s ago may still land within its acceptance window of %s", j.Quiet.Round(time.Second), j.Window)}
	}
	return Verdict{Code: EUNSURE, Why: "the acquirer could not say what happened"}
}
