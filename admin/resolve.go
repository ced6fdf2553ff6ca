package admin

import (
	"context"
	"fmt"
	"strings"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/idempotency"
)

// decision is an operator's decision about one stuck record, of any kind,
// as the kind's resolve method (Resolve, ResolveRefund, ResolveOperation)
// sets it up for resolveRecord: the rules are the same for every kind
// (SPEC "Operators"), only the acquirer's question and the final answer
// differ.
type decision struct {
	// id names the object resolved (ch_…, re_…, cp_… or vd_…).
	id string
	// kinds are the record kinds the route resolves: an id of another
	// kind is ENOTFOUND, and nothing is claimed.
	kinds []chargeonce.RecordKind
	// wanted is the status decided, for messages and the history.
	wanted string
	reason string
	force  bool
	// what names the object in messages ("charge", "refund", "capture").
	what string
	// lookup asks the acquirer what became of rec's reference
	// (LookupToResolve).
	lookup func(ctx context.Context, rec *chargeonce.KeyRecord) (chargeonce.LookupResult, error)
	// describe says the lookup's answer in a line.
	describe func(chargeonce.LookupResult, error) string
	// effect says the decided outcome is that the request took effect
	// (captured, authorized, succeeded), not a "no".
	effect bool
	// seen reads an answer the lookup gave in the terms of the rule every
	// kind shares (chargeonce.Judge): what landed, and whether a found
	// outcome is the one decided.
	seen func(lr chargeonce.LookupResult) (seen chargeonce.Seen, matches bool)
	// settle returns the completion of rec as decided (its Kind, identity,
	// token and TTL are filled in by resolveRecord), the audit entry's
	// outcome, and what its detail says before the acquirer's answer.
	settle func(rec *chargeonce.KeyRecord, lr chargeonce.LookupResult, found bool) (c chargeonce.KeyCompleteParams, outcome, about string)
}

// resolved is what resolveRecord did.
type resolved struct {
	rec    chargeonce.KeyRecord
	audit  chargeonce.HistoryEntry
	answer string
	forced bool
}

// kindOf is the record kind an object id names, by its prefix: re_ a
// refund, cp_ a capture, vd_ a cancel, anything else a charge.
func kindOf(id string) chargeonce.RecordKind {
	switch {
	case strings.HasPrefix(id, "re_"):
		return chargeonce.KindRefund
	case strings.HasPrefix(id, "cp_"):
		return chargeonce.KindCapture
	case strings.HasPrefix(id, "vd_"):
		return chargeonce.KindCancel
	}
	return chargeonce.KindCharge
}

// resolveRecord settles a stuck record as admin decided, whatever its
// kind (SPEC "POST /admin/v1/charges/{id}/resolve"):
//
//  1. it claims the record only when nobody drives it (its lease ended, or
//     its owner let go and the rest is a back-off): an attempt or recovery
//     pass in flight may still move money, so that is ELEASED, with
//     nothing changed, force or not;
//  2. it asks the acquirer what happened (d.lookup, LookupToResolve, not
//     whether a re-send is safe) and keeps the answer;
//  3. it judges the decision against the answer by the rule every kind
//     shares (chargeonce.Judge, SPEC "Finality"): money the acquirer says
//     moved is never settled as none, even forced; a contradicted
//     outcome, or a positive one on a reference the acquirer never saw,
//     needs force (EDISAGREES); a "no" on a reference it never saw waits
//     (EUNSURE with Retry-After) until the acceptance window has passed
//     since our last request, unless the acquirer fences the reference
//     (asked here when it can) or force overrides; a lookup that failed
//     or could not tell needs force (EUNSURE). A refusal is appended to
//     the history and hands the record back to recovery as it was;
//  4. otherwise the final answer is stored through the completion
//     attempts and recovery use for the record's kind (so retries replay
//     it and its event is written once, by that statement), with the
//     audit entry, in one transaction.
//
// A record no longer processing is ENOTPROCESSING, whoever settled it; an
// id of a kind the route does not resolve is ENOTFOUND.
func (s *Server) resolveRecord(ctx context.Context, admin string, d decision) (resolved, error) {
	notFound := chargeonce.Errorf(chargeonce.ENOTFOUND, "%s %q not found", d.what, d.id)
	if !kindIn(kindOf(d.id), d.kinds) {
		return resolved{}, notFound
	}
	// The claim and the writes after it run to their end whatever the
	// operator's connection does: a claim cut short may have committed all
	// the same, and would hold the record for a whole lease, resolved by
	// no one.
	base := context.WithoutCancel(ctx)
	token := idempotency.NewToken()
	cctx, cancel := context.WithTimeout(base, s.cfg.AcquirerTimeout)
	rec, err := s.ops.ChargeResolveClaim(cctx, d.id, token, s.cfg.Lease)
	cancel()
	if err != nil {
		return resolved{}, err
	}
	if !kindIn(rec.Kind(), d.kinds) || rec.ObjectID() != d.id {
		// An id whose prefix lies about its kind: hand the record back.
		s.handBack(base, &rec, token)
		return resolved{}, notFound
	}
	actor := "admin:" + admin
	actx, cancel := context.WithTimeout(base, s.cfg.AcquirerTimeout)
	lr, lerr := d.lookup(actx, &rec)
	cancel()
	j := chargeonce.Judgement{Effect: d.effect, Force: d.force, Quiet: rec.Quiet, Window: chargeonce.WindowOf(s.cfg.Finality)}
	if lerr == nil {
		j.Seen, j.Matches = d.seen(lr)
		j.Binding = lr.Binding
	}
	answer := d.describe(lr, lerr)
	if f, ok := s.cfg.Finality.(chargeonce.Fencer); ok && j.Seen == chargeonce.SeenNever && !d.effect && j.Quiet < j.Window {
		// A "no" on a reference the acquirer never saw is final only once
		// nothing can land: fence it rather than wait out the window. What
		// landed first, the fence answers instead.
		fctx, cancel := context.WithTimeout(base, s.cfg.AcquirerTimeout)
		flr, ferr := f.Fence(fctx, rec.LookupRequest(chargeonce.LookupToResolve))
		cancel()
		if ferr != nil {
			answer += "; fence failed: " + ferr.Error()
		} else {
			lr = flr
			j.Seen, j.Matches = d.seen(lr)
			j.Binding, j.Fenced = lr.Binding, lr.Fenced
			answer += "; fence: " + d.describe(lr, nil)
		}
	}
	found := lerr == nil && lr.Status == chargeonce.LookupFound
	v := chargeonce.Judge(j)
	if !v.Settle {
		var refusal error
		switch {
		case v.Binds:
			refusal = chargeonce.Errorf(chargeonce.EDISAGREES,
				"the acquirer says %s, which rules out %s whatever force says (%s); nothing was settled", answer, d.wanted, v.Why)
		case v.Code == chargeonce.EDISAGREES:
			refusal = chargeonce.Errorf(chargeonce.EDISAGREES,
				"the acquirer says %s, which contradicts %s (%s); nothing was settled (send force to override)", answer, d.wanted, v.Why)
		default:
			refusal = &chargeonce.Error{Code: chargeonce.EUNSURE, RetryAfter: v.RetryAfter, Message: fmt.Sprintf(
				"the acquirer could not say what became of the %s for good (%s: %s); nothing was settled: try again later, or send force to settle without its answer", d.what, answer, v.Why)}
		}
		s.refuse(base, &rec, token, actor, d.wanted, d.reason, answer)
		return resolved{rec: rec, answer: answer}, refusal
	}
	if v.Why != "" {
		answer += " (" + v.Why + ")"
	}
	c, outcome, about := d.settle(&rec, lr, found)
	c.Kind, c.MerchantID, c.Key, c.Token, c.TTL = rec.Kind(), rec.MerchantID, rec.Key, token, s.cfg.KeyTTL
	forced := v.Forced
	wctx, wcancel := context.WithTimeout(base, s.cfg.AcquirerTimeout)
	defer wcancel()
	audit, err := s.ops.ChargeResolve(wctx, chargeonce.ResolveParams{
		Complete: c,
		Audit: chargeonce.HistoryEntry{
			ChargeID: d.id, MerchantID: rec.MerchantID, Kind: chargeonce.HistoryResolution, Actor: actor,
			Outcome: outcome, Detail: about + "acquirer: " + answer, Reason: d.reason, Forced: forced,
		},
	})
	if chargeonce.ErrorCode(err) == chargeonce.ESTALE {
		return resolved{}, chargeonce.Errorf(chargeonce.ENOTPROCESSING, "%s %s was settled by somebody else meanwhile; nothing changed", d.what, d.id)
	}
	if err != nil {
		return resolved{}, err
	}
	return resolved{rec: rec, audit: audit, answer: answer, forced: forced}, nil
}

// seenOf reads a lookup's answer for chargeonce.Judge: effect and matches
// say, of a found outcome, whether it took effect and whether it is the
// one decided (each kind reads its own result).
func seenOf(lr chargeonce.LookupResult, effect, matches bool) (chargeonce.Seen, bool) {
	switch {
	case lr.Status == chargeonce.LookupFound && effect:
		return chargeonce.SeenEffect, matches
	case lr.Status == chargeonce.LookupFound:
		return chargeonce.SeenNoEffect, matches
	case lr.Status == chargeonce.LookupSafeToSend:
		return chargeonce.SeenNever, false
	case lr.Open():
		return chargeonce.SeenOpen, false
	}
	return chargeonce.SeenUnknown, false
}

func kindIn(k chargeonce.RecordKind, kinds []chargeonce.RecordKind) bool {
	for _, v := range kinds {
		if k == v {
			return true
		}
	}
	return false
}
