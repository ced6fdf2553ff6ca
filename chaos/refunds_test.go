package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/chargeonce/chargeonce"
)

// Refunds under the nemesis: after an HTTP charge is answered captured,
// some clients refund it, with two or three partial refunds at once that
// together ask for more than was captured, each retried with its own key
// until a final answer (across kills, outages and cuts), some with a
// concurrent replay of the same key. The history keeps every refund call;
// checkRefunds holds them, per charge, against the acquirer's ledger.

const (
	// refundShare is the percentage of captured HTTP charges that are
	// refunded.
	refundShare = 35
	// chargeCents is what every intent charges (intent.Body).
	chargeCents = 2500
)

// refundAmounts are the partial refunds a charge gets, two or three at
// once: any three ask for more than chargeCents.
var refundAmounts = []int64{700, 1000, 1200}

// refundKey is one refund of a charge: its own idempotency key and body.
type refundKey struct {
	Key    string
	Amount int64
}

// refundWork is the refunds issued on one captured charge.
type refundWork struct {
	Intent   int
	ChargeID string
	Captured int64
	Keys     []refundKey
}

// refundRecord is one refund call: retried with its key until a final
// answer or the horizon.
type refundRecord struct {
	ChargeID   string
	Key        string
	Amount     int64
	Client     int
	Out        output
	Call, Ret  int64
	Attempts   int
	LastStatus string
}

// Outcomes of a refund call beside outFinal (201: the stored refund),
// outUnknown and outOther.
const (
	// outRefused: 400 refund-exceeds-captured; nothing was kept for the
	// key, so a later call with it may still succeed.
	outRefused = "refused"
)

// refundLog is the refunds part of the history.
type refundLog struct {
	mu    sync.Mutex
	works []*refundWork
	recs  []refundRecord
}

func (l *refundLog) addWork(w *refundWork) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.works = append(l.works, w)
}

func (l *refundLog) add(r refundRecord) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r)
}

func (l *refundLog) snapshot() ([]*refundWork, []refundRecord) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*refundWork(nil), l.works...), append([]refundRecord(nil), l.recs...)
}

// chargeIDOf returns the id of a captured charge's answer, or "".
func chargeIDOf(out output) string {
	if out.Kind != outFinal || out.Status != http.StatusCreated {
		return ""
	}
	var ch struct{ ID, Status string }
	if json.Unmarshal([]byte(out.Body), &ch) != nil || ch.Status != string(chargeonce.StatusCaptured) {
		return ""
	}
	return ch.ID
}

// refund issues two or three concurrent partial refunds of the captured
// charge, some with a concurrent replay of the same key, and waits for
// their calls.
func (w *workload) refund(client int, in *intent, chargeID string, rng *rand.Rand) {
	n := 2 + rng.IntN(2)
	work := &refundWork{Intent: in.ID, ChargeID: chargeID, Captured: chargeCents}
	for i := range n {
		work.Keys = append(work.Keys, refundKey{Key: fmt.Sprintf("%s-refund-%d", in.Key, i), Amount: refundAmounts[rng.IntN(len(refundAmounts))]})
	}
	w.refunds.addWork(work)
	var wg sync.WaitGroup
	for i, k := range work.Keys {
		if rng.IntN(100) < 25 {
			delay := time.Duration(rng.IntN(300)) * time.Millisecond
			wg.Go(func() {
				time.Sleep(delay)
				w.refundCall(client+6000+100*i, chargeID, k)
			})
		}
		wg.Go(func() { w.refundCall(client+6000+100*i+50, chargeID, k) })
	}
	wg.Wait()
}

// refundCall runs one refund call over HTTP, retrying as the Go client
// does (the same key and body until a final answer), and records it.
func (w *workload) refundCall(client int, chargeID string, k refundKey) {
	body := []byte(`{"amount_cents":` + strconv.FormatInt(k.Amount, 10) + `}`)
	rec := refundRecord{ChargeID: chargeID, Key: k.Key, Amount: k.Amount, Client: client, Call: w.h.now()}
	deadline := time.Now().Add(horizon)
	bases := w.c.httpBases()
	rng := rand.New(rand.NewPCG(uint64(len(k.Key)), uint64(client))) //nolint:gosec // G404: jitter
	for n := 1; ; n++ {
		rec.Attempts = n
		status, hdr, b, err := w.postTo(bases[rng.IntN(len(bases))], "/v1/charges/"+chargeID+"/refunds", k.Key, body)
		var retryAfter time.Duration
		switch {
		case err != nil:
			rec.LastStatus = err.Error()
		case status == http.StatusCreated:
			rec.Out = output{Kind: outFinal, Status: status, Body: string(b)}
		case status == http.StatusBadRequest && strings.Contains(string(b), chargeonce.EREFUNDEXCEEDS):
			rec.Out = output{Kind: outRefused, Status: status, Body: string(b)}
		case status == 202 || status == 408 || status == 409 || status == 429 || status >= 500:
			if status == http.StatusInternalServerError {
				w.note500()
			}
			rec.LastStatus = strconv.Itoa(status) + " " + abbreviate(string(b))
			if s, err := strconv.Atoi(hdr.Get("Retry-After")); err == nil {
				retryAfter = time.Duration(s) * time.Second
			}
		default:
			rec.Out = output{Kind: outOther, Status: status, Body: string(b)}
		}
		if rec.Out.Kind != "" {
			break
		}
		wait := max(time.Duration(rng.Int64N(int64(min(backoffMax, backoffBase<<min(n, 10)))+1)), retryAfter)
		if time.Now().Add(wait).After(deadline) {
			rec.Out = output{Kind: outUnknown, Err: "gave up after " + strconv.Itoa(n) + " attempts; last: " + rec.LastStatus}
			break
		}
		time.Sleep(wait)
	}
	rec.Ret = w.h.now()
	w.refunds.add(rec)
}

// settleRefunds asks once more, after healing, for every refund key that
// got no final answer.
func (w *workload) settleRefunds() {
	works, recs := w.refunds.snapshot()
	final := map[string]bool{}
	for _, r := range recs {
		if r.Out.Kind == outFinal || r.Out.Kind == outRefused {
			final[r.Key] = true
		}
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for _, wk := range works {
		for _, k := range wk.Keys {
			if final[k.Key] {
				continue
			}
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				w.refundCall(4000, wk.ChargeID, k)
			})
		}
	}
	wg.Wait()
}

// refundLedger reads every refund the acquirer's ledger holds for the
// merchant.
func refundLedger(ctx context.Context, l chargeonce.Ledger, since time.Time) ([]chargeonce.LedgerEntry, error) {
	var out []chargeonce.LedgerEntry
	p := chargeonce.LedgerParams{From: since.Add(-time.Hour), To: time.Now().Add(time.Hour), Limit: 1000}
	for {
		page, err := l.LedgerList(ctx, p)
		if err != nil {
			return nil, err
		}
		for _, e := range page.Entries {
			if e.Kind == chargeonce.LedgerRefund && e.Merchant == merchant {
				out = append(out, e)
			}
		}
		if page.Next == "" {
			return out, nil
		}
		p.After = page.Next
	}
}

// refundAnswer is the part of a refund's 201 body the checker reads.
type refundAnswer struct {
	ID          string `json:"id"`
	ChargeID    string `json:"charge_id"`
	AmountCents int64  `json:"amount_cents"`
	Status      string `json:"status"`
}

// checkRefunds holds the refund calls against the acquirer's ledger, per
// charge:
//   - every 201 for a key is the same stored answer, byte for byte, and a
//     refund of the key's charge and amount;
//   - what the service acknowledged as succeeded, and what the ledger
//     refunded, never exceed the captured amount;
//   - each refund reaches the ledger at most once: one entry per
//     reference, and no more references than the charge had keys, each
//     the id the service answered for its key (when it answered);
//   - every acknowledged refund (201 succeeded) is in the ledger,
//     succeeded, with its amount; one acknowledged failed moved nothing;
//   - no call got an answer a valid refund never gets.
//
// It returns one line per anomaly, naming the charge.
func checkRefunds(works []*refundWork, recs []refundRecord, ledger []chargeonce.LedgerEntry) []string {
	byCharge := map[string][]refundRecord{}
	for _, r := range recs {
		byCharge[r.ChargeID] = append(byCharge[r.ChargeID], r)
	}
	entries := map[string][]chargeonce.LedgerEntry{}
	for _, e := range ledger {
		entries[e.ChargeReference] = append(entries[e.ChargeReference], e)
	}
	var out []string
	for _, wk := range works {
		bad := func(format string, args ...any) {
			out = append(out, fmt.Sprintf("charge %s (intent %d): ", wk.ChargeID, wk.Intent)+fmt.Sprintf(format, args...))
		}
		amount := map[string]int64{}
		for _, k := range wk.Keys {
			amount[k.Key] = k.Amount
		}
		stored := map[string]string{} // key -> the 201 body
		decided := map[string]bool{}  // keys with a 201 or a refusal
		ids := map[string]string{}    // refund id -> key
		acked := map[string]refundAnswer{}
		rs := byCharge[wk.ChargeID]
		sort.Slice(rs, func(i, j int) bool { return rs[i].Call < rs[j].Call })
		for _, r := range rs {
			if r.Out.Kind == outFinal || r.Out.Kind == outRefused {
				decided[r.Key] = true
			}
			switch r.Out.Kind {
			case outFinal:
				if prev, ok := stored[r.Key]; ok && prev != r.Out.Body {
					bad("key %s answered two different refunds: %s and %s", r.Key, abbreviate(prev), abbreviate(r.Out.Body))
					continue
				}
				stored[r.Key] = r.Out.Body
				var a refundAnswer
				if err := json.Unmarshal([]byte(r.Out.Body), &a); err != nil || a.ID == "" {
					bad("key %s: a 201 that is no refund: %s", r.Key, abbreviate(r.Out.Body))
					continue
				}
				if a.ChargeID != wk.ChargeID || a.AmountCents != amount[r.Key] {
					bad("key %s: refund %s of %s for %d; asked of %s for %d", r.Key, a.ID, a.ChargeID, a.AmountCents, wk.ChargeID, amount[r.Key])
				}
				ids[a.ID] = r.Key
				if a.Status == string(chargeonce.RefundSucceeded) {
					acked[a.ID] = a
				}
			case outOther:
				bad("key %s: %d %s, an answer a valid refund never gets", r.Key, r.Out.Status, abbreviate(r.Out.Body))
			}
		}
		var ackedSum int64
		for _, a := range acked {
			ackedSum += a.AmountCents
		}
		if ackedSum > wk.Captured {
			bad("the service acknowledged %d refunded of a capture of %d", ackedSum, wk.Captured)
		}
		perRef := map[string][]chargeonce.LedgerEntry{}
		var ledgerSum int64
		for _, e := range entries[wk.ChargeID] {
			perRef[e.Reference] = append(perRef[e.Reference], e)
			if e.Status == string(chargeonce.RefundSucceeded) {
				ledgerSum += e.AmountCents
			}
		}
		if ledgerSum > wk.Captured {
			bad("the acquirer refunded %d of a capture of %d", ledgerSum, wk.Captured)
		}
		if len(perRef) > len(wk.Keys) {
			bad("the acquirer holds %d refunds for %d refund keys", len(perRef), len(wk.Keys))
		}
		for ref, es := range perRef {
			if len(es) > 1 {
				bad("refund %s reached the acquirer's ledger %d times", ref, len(es))
			}
			if _, known := ids[ref]; !known && len(decided) == len(wk.Keys) {
				bad("the acquirer holds refund %s, which no key was answered with", ref)
			}
		}
		for id, a := range acked {
			es := perRef[id]
			if len(es) == 0 || es[0].Status != string(chargeonce.RefundSucceeded) || es[0].AmountCents != a.AmountCents {
				bad("refund %s (key %s) was acknowledged succeeded for %d but the ledger has %+v", id, ids[id], a.AmountCents, es)
			}
		}
		for id, key := range ids {
			if _, ok := acked[id]; ok {
				continue
			}
			for _, e := range perRef[id] {
				if e.Status == string(chargeonce.RefundSucceeded) {
					bad("refund %s (key %s) was answered not succeeded but the acquirer refunded it", id, key)
				}
			}
		}
	}
	sort.Strings(out)
	return out
}
