package admin

import (
	"context"
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
	// judge reads an answer the lookup gave: whether it found the
	// reference settled, whether that outcome contradicts the decision,
	// and whether the acquirer's own state binds (the decision is refused
	// even when forced).
	judge func(lr chargeonce.LookupResult) (found, disagrees, binds bool)
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
//  3. it refuses (EUNSURE) when the lookup failed, timed out or could not
//     tell, and (EDISAGREES) when the acquirer holds an outcome that
//     contradicts the decision, unless forced; an outcome that binds
//     refuses even when forced. A refusal is appended to the history and
//     hands the record back to recovery;
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
	answer := d.describe(lr, lerr)
	unsure := lerr != nil || lr.Status == chargeonce.LookupUnsure
	var found, disagrees, binds bool
	if lerr == nil {
		found, disagrees, binds = d.judge(lr)
	}
	var refusal error
	switch {
	case binds:
		refusal = chargeonce.Errorf(chargeonce.EDISAGREES,
			"the acquirer says %s, which rules out %s whatever force says; nothing was settled", answer, d.wanted)
	case unsure && !d.force:
		refusal = chargeonce.Errorf(chargeonce.EUNSURE,
			"the acquirer could not say what became of the %s (%s); nothing was settled: try again later, or send force to settle without its answer", d.what, answer)
	case disagrees && !d.force:
		refusal = chargeonce.Errorf(chargeonce.EDISAGREES,
			"the acquirer says %s, which contradicts %s; nothing was settled (send force to override)", answer, d.wanted)
	}
	if refusal != nil {
		s.refuse(base, &rec, token, actor, d.wanted, d.reason, answer)
		return resolved{rec: rec, answer: answer}, refusal
	}
	c, outcome, about := d.settle(&rec, lr, found)
	c.Kind, c.MerchantID, c.Key, c.Token, c.TTL = rec.Kind(), rec.MerchantID, rec.Key, token, s.cfg.KeyTTL
	forced := disagrees || unsure
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

func kindIn(k chargeonce.RecordKind, kinds []chargeonce.RecordKind) bool {
	for _, v := range kinds {
		if k == v {
			return true
		}
	}
	return false
}
