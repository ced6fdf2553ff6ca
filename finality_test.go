package chargeonce_test

import (
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
)

// TestJudge is the finality rule's table (SPEC "Finality"), for every kind
// alike: what may be recorded over what the acquirer said.
func TestJudge(t *testing.T) {
	t.Parallel()
	const w = time.Minute
	type want struct {
		settle, forced, binds bool
		code                  string
	}
	settle := want{settle: true}
	for _, c := range []struct {
		name string
		j    chargeonce.Judgement
		want want
	}{
		{"no on never seen, within the window", chargeonce.Judgement{Seen: chargeonce.SeenNever, Quiet: 10 * time.Second, Window: w}, want{code: chargeonce.EUNSURE}},
		{"no on never seen, a back-off still running", chargeonce.Judgement{Seen: chargeonce.SeenNever, Quiet: -time.Hour, Window: w}, want{code: chargeonce.EUNSURE}},
		{"no on never seen, past the window", chargeonce.Judgement{Seen: chargeonce.SeenNever, Quiet: 2 * w, Window: w}, settle},
		{"no on never seen, fenced", chargeonce.Judgement{Seen: chargeonce.SeenNever, Fenced: true, Window: w}, settle},
		{"no on never seen, forced", chargeonce.Judgement{Seen: chargeonce.SeenNever, Force: true, Window: w}, want{settle: true, forced: true, code: chargeonce.EUNSURE}},
		{"yes on never seen", chargeonce.Judgement{Effect: true, Seen: chargeonce.SeenNever, Quiet: 2 * w, Window: w}, want{code: chargeonce.EDISAGREES}},
		{"yes on never seen, fenced", chargeonce.Judgement{Effect: true, Seen: chargeonce.SeenNever, Fenced: true, Window: w}, want{code: chargeonce.EDISAGREES}},
		{"yes on never seen, forced", chargeonce.Judgement{Effect: true, Force: true, Seen: chargeonce.SeenNever, Window: w}, want{settle: true, forced: true, code: chargeonce.EDISAGREES}},
		{"no over money moved", chargeonce.Judgement{Seen: chargeonce.SeenEffect}, want{binds: true, code: chargeonce.EDISAGREES}},
		{"no over money moved, forced", chargeonce.Judgement{Seen: chargeonce.SeenEffect, Force: true}, want{binds: true, code: chargeonce.EDISAGREES}},
		{"no over an open object, forced", chargeonce.Judgement{Seen: chargeonce.SeenOpen, Force: true}, want{binds: true, code: chargeonce.EDISAGREES}},
		{"yes over an open object", chargeonce.Judgement{Effect: true, Seen: chargeonce.SeenOpen}, want{code: chargeonce.EUNSURE}},
		{"yes as found", chargeonce.Judgement{Effect: true, Seen: chargeonce.SeenEffect, Matches: true}, settle},
		{"another yes than found", chargeonce.Judgement{Effect: true, Seen: chargeonce.SeenEffect}, want{code: chargeonce.EDISAGREES}},
		{"another yes than found, binding", chargeonce.Judgement{Effect: true, Seen: chargeonce.SeenEffect, Binding: true, Force: true}, want{binds: true, code: chargeonce.EDISAGREES}},
		{"yes over a decline", chargeonce.Judgement{Effect: true, Seen: chargeonce.SeenNoEffect}, want{code: chargeonce.EDISAGREES}},
		{"yes over a decline, forced", chargeonce.Judgement{Effect: true, Seen: chargeonce.SeenNoEffect, Force: true}, want{settle: true, forced: true, code: chargeonce.EDISAGREES}},
		{"no as found", chargeonce.Judgement{Seen: chargeonce.SeenNoEffect, Matches: true}, settle},
		{"lookup failed", chargeonce.Judgement{Seen: chargeonce.SeenUnknown}, want{code: chargeonce.EUNSURE}},
		{"lookup failed, forced", chargeonce.Judgement{Seen: chargeonce.SeenUnknown, Force: true}, want{settle: true, forced: true, code: chargeonce.EUNSURE}},
	} {
		v := chargeonce.Judge(c.j)
		got := want{settle: v.Settle, forced: v.Forced, binds: v.Binds, code: v.Code}
		if got != c.want {
			t.Errorf("%s: %+v (%s), want %+v", c.name, got, v.Why, c.want)
		}
		if v.Code == chargeonce.EUNSURE && c.j.Seen == chargeonce.SeenNever && !v.Settle && v.RetryAfter != c.j.Window-c.j.Quiet {
			t.Errorf("%s: RetryAfter %s, want the window's rest %s", c.name, v.RetryAfter, c.j.Window-c.j.Quiet)
		}
	}
}
