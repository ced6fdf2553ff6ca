// Package admin is the operators' side of chargeonce (SPEC "Operators:
// stuck charges, history, resolution"): a JSON API under /admin/v1/ and a
// web console under /admin/, served on a listener of their own
// (--admin-addr) and authenticated by admin keys that never work on the
// merchant API (nor merchant keys here).
//
// Operators list the charges stuck processing across merchants, read a
// charge's history (derived from its record on the common path, appended
// on the unusual ones), and resolve a charge: the reference is looked up at
// the acquirer first, a contradicting answer refuses the resolution unless
// forced, and the final answer is stored through the very completion
// attempts and recovery use, with an append-only audit entry beside it.
package admin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/engine"
)

// Defaults of Config.
const (
	DefaultLease           = engine.DefaultLease
	DefaultAcquirerTimeout = engine.DefaultAcquirerTimeout
	DefaultKeyTTL          = engine.DefaultKeyTTL
	// DefaultSessionTTL is how long a console session lasts after login.
	DefaultSessionTTL = 8 * time.Hour
	// DefaultDeclineCode is a resolution's decline code when the operator
	// gives none and the acquirer named none.
	DefaultDeclineCode = "operator_declined"
	// MaxReasonLen bounds a resolution's reason, in characters.
	MaxReasonLen = 500
)

// Config configures a Server. Store must also implement
// chargeonce.OperatorStore (both stores do).
type Config struct {
	Store    chargeonce.Store
	Acquirer chargeonce.Acquirer
	Keys     *Keys
	Logger   *slog.Logger
	// Lease is how long a resolution holds the record it claimed; it
	// bounds how long recovery waits when the resolution dies midway.
	Lease time.Duration
	// AcquirerTimeout bounds a resolution's lookup.
	AcquirerTimeout time.Duration
	// KeyTTL is how long the resolved answer is replayed (--key-ttl).
	KeyTTL     time.Duration
	SessionTTL time.Duration
	// TrustedProxies are the proxies (addresses or networks) whose
	// X-Forwarded-For names the client and whose X-Forwarded-Proto: https
	// says the operator's browser speaks HTTPS (--admin-trusted-proxies).
	TrustedProxies []netip.Prefix
	// Finality is what the acquirer promises about requests that land
	// late (SPEC "Finality"): its acceptance window and, when it is a
	// chargeonce.Fencer, its fence. A resolution records a "no" on a
	// reference the acquirer never saw only once it is fenced or the
	// window has passed since our last request. Nil means
	// chargeonce.DefaultAcceptanceWindow and no fence. It is passed here
	// explicitly, not found on Acquirer, so no wrapper can drop it.
	Finality chargeonce.Finality
}

// Server serves the admin API and the console.
type Server struct {
	store    chargeonce.Store
	ops      chargeonce.OperatorStore
	acquirer chargeonce.Acquirer
	keys     *Keys
	log      *slog.Logger
	cfg      Config
	sessions *sessions
	guard    *guard
	mux      *http.ServeMux
}

// New returns the admin server.
func New(cfg Config) (*Server, error) {
	ops, ok := cfg.Store.(chargeonce.OperatorStore)
	if !ok {
		return nil, fmt.Errorf("admin: the store (%T) keeps no history", cfg.Store)
	}
	if cfg.Keys == nil || cfg.Acquirer == nil {
		return nil, errors.New("admin: Keys and Acquirer are required")
	}
	if cfg.Lease <= 0 {
		cfg.Lease = DefaultLease
	}
	if cfg.AcquirerTimeout <= 0 {
		cfg.AcquirerTimeout = DefaultAcquirerTimeout
	}
	if cfg.KeyTTL <= 0 {
		cfg.KeyTTL = DefaultKeyTTL
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = DefaultSessionTTL
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		store: cfg.Store, ops: ops, acquirer: cfg.Acquirer, keys: cfg.Keys, log: cfg.Logger, cfg: cfg,
		sessions: newSessions(cfg.SessionTTL), guard: newGuard(),
	}
	s.routes()
	return s, nil
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// ResolveRequest is an operator's decision about a processing charge.
type ResolveRequest struct {
	Status      chargeonce.Status `json:"status"`
	DeclineCode string            `json:"decline_code,omitempty"`
	Reason      string            `json:"reason"`
	Force       bool              `json:"force,omitempty"`
}

// Check validates the request.
func (q *ResolveRequest) Check() error {
	switch q.Status {
	case chargeonce.StatusCaptured, chargeonce.StatusAuthorized, chargeonce.StatusDeclined:
	default:
		return chargeonce.FieldError("status", "status must be captured or declined (a charge with automatic capture), or authorized or declined (capture_method manual)")
	}
	if q.Status != chargeonce.StatusDeclined && q.DeclineCode != "" {
		return chargeonce.FieldError("decline_code", "only a declined charge has a decline_code; this one is resolved %s", q.Status)
	}
	if !chargeonce.ValidText(q.Reason) || !chargeonce.ValidText(q.DeclineCode) {
		return chargeonce.FieldError("reason", "reason and decline_code must be valid UTF-8 without U+0000")
	}
	if strings.TrimSpace(q.Reason) == "" {
		return chargeonce.FieldError("reason", "reason is required: say why (who at the acquirer confirmed what)")
	}
	if n := utf8.RuneCountInString(q.Reason); n > MaxReasonLen {
		return chargeonce.FieldError("reason", "reason must be at most %d characters; got %d", MaxReasonLen, n)
	}
	if len(q.DeclineCode) > 64 {
		return chargeonce.FieldError("decline_code", "decline_code must be at most 64 characters")
	}
	return nil
}

// Fits refuses a decision the charge's capture method rules out, with an
// EINVALID error naming status: the acquirer was asked to capture an
// automatic charge, which it captured or declined, and only to authorize a
// manual one (capture_method manual), which it authorized or declined. An
// operator who knows an authorization was captured elsewhere cannot say
// so here: its charge is resolved authorized, and captured through the
// merchant API, so that the capture, its amount and its event are the
// protocol's own.
func (q *ResolveRequest) Fits(ch *chargeonce.Charge) error {
	manual := ch.CaptureMethod == chargeonce.CaptureManual
	switch {
	case manual && q.Status == chargeonce.StatusCaptured:
		return chargeonce.FieldError("status", "charge %s has capture_method manual: the acquirer was only asked to authorize it, so it is resolved authorized or declined, never captured (capture it afterwards with POST /v1/charges/%s/capture)", ch.ID, ch.ID)
	case !manual && q.Status == chargeonce.StatusAuthorized:
		return chargeonce.FieldError("status", "charge %s captures automatically: it is resolved captured or declined; authorized is only for a charge with capture_method manual", ch.ID)
	}
	return nil
}

// Resolution is what a resolution did.
type Resolution struct {
	Charge chargeonce.Charge
	Audit  chargeonce.HistoryEntry
	// AcquirerAnswer is what the lookup said.
	AcquirerAnswer string
}

// Resolve settles a processing charge as admin decided (SPEC "POST
// /admin/v1/charges/{id}/resolve"), under the rules every kind shares (see
// resolveRecord): the acquirer is asked what happened to the charge's
// reference (Acquirer.Lookup); a capture (or, for a manual charge, an
// authorization) it holds contradicts "declined", and a decline "captured"
// or "authorized"; a PaymentIntent that succeeded, holds an authorization
// or may still move money binds, so it cannot be declined even when
// forced. A charge is resolved as its capture method allows (see Fits):
// captured or declined with automatic capture, authorized or declined with
// capture_method manual, which settles it as the engine settles an
// authorization (its answer, and no event: an authorization records none),
// to be captured or canceled through the merchant API afterwards. A
// declined charge's decline code is the operator's, else the acquirer's,
// else DefaultDeclineCode.
func (s *Server) Resolve(ctx context.Context, admin, chargeID string, q ResolveRequest) (Resolution, error) {
	if err := q.Check(); err != nil {
		return Resolution{}, err
	}
	if kindOf(chargeID) == chargeonce.KindCharge {
		// The capture method is read before anything is claimed, so that
		// a decision it rules out changes nothing: no claim, no lookup, no
		// history. It never changes, so the claim cannot see another.
		in, err := s.ops.ChargeInspect(ctx, chargeID)
		if err != nil {
			return Resolution{}, err
		}
		if err := q.Fits(&in.Charge); err != nil {
			return Resolution{}, err
		}
	}
	var final chargeonce.Charge
	res, err := s.resolveRecord(ctx, admin, decision{
		id: chargeID, kinds: []chargeonce.RecordKind{chargeonce.KindCharge}, what: "charge",
		wanted: string(q.Status), reason: q.Reason, force: q.Force,
		lookup: func(ctx context.Context, rec *chargeonce.KeyRecord) (chargeonce.LookupResult, error) {
			return s.acquirer.Lookup(ctx, rec.LookupRequest(chargeonce.LookupToResolve))
		},
		describe: describeLookup,
		effect:   q.Status != chargeonce.StatusDeclined,
		seen: func(lr chargeonce.LookupResult) (chargeonce.Seen, bool) {
			return seenOf(lr, lr.Result.Status != chargeonce.StatusDeclined, lr.Result.Status == q.Status)
		},
		settle: func(rec *chargeonce.KeyRecord, lr chargeonce.LookupResult, found bool) (chargeonce.KeyCompleteParams, string, string) {
			final = rec.Charge
			final.Status = q.Status
			if q.Status == chargeonce.StatusDeclined {
				final.DeclineCode = q.DeclineCode
				if final.DeclineCode == "" && found && lr.Result.Status == chargeonce.StatusDeclined {
					final.DeclineCode = lr.Result.DeclineCode
				}
				if final.DeclineCode == "" {
					final.DeclineCode = DefaultDeclineCode
				}
			}
			resp := engine.FinalResponse(&final)
			outcome := string(final.Status)
			if final.DeclineCode != "" {
				outcome += " (" + final.DeclineCode + ")"
			}
			return chargeonce.KeyCompleteParams{
				ChargeStatus: final.Status, DeclineCode: final.DeclineCode,
				ResponseStatus: resp.Status, ResponseBody: resp.Body,
			}, outcome, ""
		},
	})
	if err != nil {
		return Resolution{AcquirerAnswer: res.answer}, err
	}
	s.log.Warn("charge resolved by an operator", "admin", admin, "charge_id", final.ID, "merchant", final.MerchantID,
		"status", final.Status, "decline_code", final.DeclineCode, "forced", res.forced, "acquirer", res.answer)
	return Resolution{Charge: final, Audit: res.audit, AcquirerAnswer: res.answer}, nil
}

// refuse appends a refused resolution (of a record of any kind) to the
// history of what the record guards and hands the record back: recovery
// may take it at once, and settles it from what the acquirer holds.
func (s *Server) refuse(base context.Context, rec *chargeonce.KeyRecord, token, actor, wanted, reason, answer string) {
	wctx, cancel := context.WithTimeout(base, s.cfg.AcquirerTimeout)
	defer cancel()
	if err := s.ops.HistoryAppend(wctx, chargeonce.HistoryEntry{
		ChargeID: rec.ObjectID(), MerchantID: rec.MerchantID, Kind: chargeonce.HistoryResolveRefused, Actor: actor,
		Outcome: "refused: wanted " + wanted, Detail: answer, Reason: reason,
	}); err != nil {
		s.log.Error("appending a refused resolution to the history failed", "id", rec.ObjectID(), "actor", actor, "err", err)
	}
	s.handBack(base, rec, token)
}

// handBack ends the resolution's lease on rec, held by nobody, where the
// lease it took over ended (rec.Quiet ago, or a back-off's remainder
// ahead): recovery may take the record as it could before, and the next
// resolution measures the acceptance window from our last request for
// the reference, not from this look (SPEC "Finality").
func (s *Server) handBack(base context.Context, rec *chargeonce.KeyRecord, token string) {
	wctx, cancel := context.WithTimeout(base, s.cfg.AcquirerTimeout)
	defer cancel()
	if err := s.store.KeyLeaseSet(wctx, rec.MerchantID, rec.Key, token, -rec.Quiet, false); err != nil && chargeonce.ErrorCode(err) != chargeonce.ESTALE {
		s.log.Error("handing a resolution's record back to recovery failed; it is recovered when the resolution's lease ends", "id", rec.ObjectID(), "err", err)
	}
}

// describeLookup says in a line what the acquirer answered.
func describeLookup(lr chargeonce.LookupResult, err error) string {
	if err != nil {
		return "lookup failed: " + err.Error()
	}
	s := engine.LookupOutcome(lr)
	if lr.Reason != "" {
		s += " — " + lr.Reason
	}
	return s
}

// Timeline is a charge's history: what its record says (inserted, settled)
// around the entries appended on the unusual paths, in time order.
func Timeline(in chargeonce.ChargeInspection, stored []chargeonce.HistoryEntry) []chargeonce.HistoryEntry {
	ch := in.Charge
	out := []chargeonce.HistoryEntry{{
		ChargeID: ch.ID, MerchantID: ch.MerchantID, At: ch.CreatedAt, Kind: chargeonce.HistoryInserted,
		Actor: engine.ActorAttempt, Outcome: "processing", Derived: true,
	}}
	commonPath := ch.Status != chargeonce.StatusProcessing && len(stored) == 0
	if !commonPath && !attemptAnswered(stored) {
		// The attempt that inserted the charge commits its record before
		// it calls the acquirer, and appends what the acquirer said only
		// when it gets an answer it cannot settle from: no entry of its own
		// means the attempt died (or its instance was killed) with the
		// capture sent or about to be, or still waits for the answer.
		// Derived, so the common path writes nothing more.
		e := chargeonce.HistoryEntry{
			ChargeID: ch.ID, MerchantID: ch.MerchantID, At: ch.CreatedAt, Kind: chargeonce.HistoryCapture,
			Actor: engine.ActorAttempt, Outcome: CaptureSentNoAnswer, Derived: true,
			Detail: "the record was committed to send the capture; no answer from the acquirer was ever stored, so money may have moved: recovery looks the reference up before sending it again",
		}
		if in.InFlight && lastClaim(stored) < 0 {
			e.Outcome, e.Detail = CaptureInFlight, "the attempt that inserted the charge holds its lease and waits for the acquirer's answer"
		}
		out = append(out, e)
	}
	out = append(out, withUnansweredDrives(in, stored)...)
	if ch.Status == chargeonce.StatusProcessing {
		return out
	}
	outcome := string(ch.Status)
	if ch.DeclineCode != "" {
		outcome += " (" + ch.DeclineCode + ")"
	}
	if len(stored) == 0 {
		// The common path: one capture, answered at once, settled by the
		// attempt that inserted the charge.
		out = append(out, chargeonce.HistoryEntry{
			ChargeID: ch.ID, MerchantID: ch.MerchantID, At: in.UpdatedAt, Kind: chargeonce.HistoryCapture,
			Actor: engine.ActorAttempt, Outcome: outcome, Derived: true,
		})
	}
	return append(out, chargeonce.HistoryEntry{
		ChargeID: ch.ID, MerchantID: ch.MerchantID, At: in.UpdatedAt, Kind: chargeonce.HistorySettled,
		Actor: settledBy(stored), Outcome: outcome, Derived: true,
	})
}

// CaptureSentNoAnswer is the outcome of a capture whose answer was never
// stored: the attempt that sent it died first.
const CaptureSentNoAnswer = "sent, no answer stored"

// CaptureInFlight is the outcome of a capture (or a re-drive's lookup and
// capture) whose driver holds a live lease: its answer may still come.
const CaptureInFlight = "sent, awaiting the answer"

// withUnansweredDrives returns the stored entries with a derived capture
// after each claim (by recovery, or by a retry) that nothing of its own
// followed: the engine appends a claim before it calls the acquirer and
// the rest of the drive when it ends, so such a drive died (its process
// killed) with the lookup, and perhaps the capture, sent and no answer
// stored; or, for the last claim of a record still under a live lease, it
// is in flight. The derived capture is at the claim's time: "capture sent
// at T".
func withUnansweredDrives(in chargeonce.ChargeInspection, stored []chargeonce.HistoryEntry) []chargeonce.HistoryEntry {
	last := lastClaim(stored)
	var out []chargeonce.HistoryEntry
	for i := range stored {
		c := stored[i]
		out = append(out, c)
		if c.Kind != chargeonce.HistoryRecoveryClaim || driveAnswered(stored, i) {
			continue
		}
		if i == last && in.Charge.Status != chargeonce.StatusProcessing && !resolvedAfter(stored, i) {
			// It settled the charge; only its trail's write failed.
			continue
		}
		e := chargeonce.HistoryEntry{
			ChargeID: c.ChargeID, MerchantID: c.MerchantID, At: c.At, Kind: chargeonce.HistoryCapture,
			Actor: c.Actor, Outcome: CaptureSentNoAnswer, Derived: true,
			Detail: c.Actor + " claimed the record to look the reference up and send the capture if that was safe, and stored nothing after: it died (its process killed) with the lookup, and perhaps the capture, sent. Money may have moved: the next drive looks the reference up before sending it again",
		}
		if i == last && in.InFlight {
			e.Outcome, e.Detail = CaptureInFlight, c.Actor+" holds the record's lease: its lookup, and perhaps its capture, is at the acquirer"
		}
		out = append(out, e)
	}
	return out
}

// lastClaim is the index of the last claim in stored, or -1.
func lastClaim(stored []chargeonce.HistoryEntry) int {
	for i := len(stored) - 1; i >= 0; i-- {
		if stored[i].Kind == chargeonce.HistoryRecoveryClaim {
			return i
		}
	}
	return -1
}

// driveAnswered reports whether the drive that made the claim stored[i]
// appended what came of it: an entry by its actor before the next claim.
func driveAnswered(stored []chargeonce.HistoryEntry, i int) bool {
	for _, e := range stored[i+1:] {
		if e.Kind == chargeonce.HistoryRecoveryClaim {
			return false
		}
		if e.Actor == stored[i].Actor && (e.Kind == chargeonce.HistoryLookup || e.Kind == chargeonce.HistoryCapture) {
			return true
		}
	}
	return false
}

// resolvedAfter reports whether an operator resolved the charge after the
// claim stored[i].
func resolvedAfter(stored []chargeonce.HistoryEntry, i int) bool {
	for _, e := range stored[i+1:] {
		if e.Kind == chargeonce.HistoryResolution {
			return true
		}
	}
	return false
}

// attemptAnswered reports whether the attempt that inserted the charge
// stored what came of its capture.
func attemptAnswered(stored []chargeonce.HistoryEntry) bool {
	for i := range stored {
		if stored[i].Actor == engine.ActorAttempt {
			return true
		}
	}
	return false
}

// settledBy names who settled a charge: the last resolution's admin, or
// the last actor that drove it.
func settledBy(stored []chargeonce.HistoryEntry) string {
	for i := len(stored) - 1; i >= 0; i-- {
		if stored[i].Kind == chargeonce.HistoryResolution {
			return stored[i].Actor
		}
	}
	if len(stored) > 0 {
		return stored[len(stored)-1].Actor
	}
	return engine.ActorAttempt
}
