package chaos

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// The history: every operation a client ran, with when it was invoked and
// when it returned (nanoseconds since the run began) and what it answered.

// Kinds of operation.
const (
	opCharge = "charge" // a charge request, over HTTP or the queue, retried until final
	opLedger = "ledger" // the acquirer's captures of the intent's order, read at the end
)

// Outcomes of an operation.
const (
	outFinal   = "final"   // 201 or 402: the stored answer
	outReused  = "reused"  // 422 idempotency-key-reused
	outUnknown = "unknown" // no final answer within the client's horizon
	outOther   = "other"   // any other answer: never allowed for a valid request
)

// input is what an operation asked.
type input struct {
	Kind    string
	Variant int8   // 1: the intent's request; 2: another request under its key
	Via     string // http, queue, queue-late (a result published after its call ended)
}

// output is what an operation answered.
type output struct {
	Kind     string
	Status   int
	Body     string
	Captured int // ledger: captures that moved money for the order
	Declined int // ledger: declined captures for the order
	Err      string
}

// state is the model's state of one intent: which request owns its key
// (0: none yet) and the stored answer once one is known.
type state struct {
	Owner  int8
	Status int
	Body   string
}

// record is one operation of the history.
type record struct {
	Intent     int
	Client     int
	In         input
	Out        output
	Call, Ret  int64
	Attempts   int
	LastStatus string // the last non-final answer, for the report
}

// history collects records from many goroutines.
type history struct {
	start time.Time
	mu    sync.Mutex
	ops   []record
}

func newHistory() *history { return &history{start: time.Now()} }

func (h *history) now() int64 { return int64(time.Since(h.start)) }

func (h *history) add(r record) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, r)
}

func (h *history) records() []record {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]record(nil), h.ops...)
}

// model is the contract for one intent, as porcupine checks it: every
// final answer is the same stored answer (so never both captured and
// declined), a 422 only for a request other than the one that owns the
// key, and the acquirer's ledger agrees with the stored answer (one
// capture for a captured intent, none for a declined one, none for a key
// nobody owns). An operation that never got a final answer may or may not
// have taken the key.
var model = porcupine.NondeterministicModel{
	Init: func() []any { return []any{state{}} },
	Step: func(st, in, out any) []any {
		s, i, o := st.(state), in.(input), out.(output)
		switch o.Kind {
		case outFinal:
			switch {
			case s.Owner == 0, s.Owner == i.Variant && s.Status == 0:
				return []any{state{Owner: i.Variant, Status: o.Status, Body: o.Body}}
			case s.Owner == i.Variant && s.Status == o.Status && s.Body == o.Body:
				return []any{s}
			}
			return nil
		case outReused:
			if s.Owner != 0 && s.Owner != i.Variant {
				return []any{s}
			}
			return nil
		case outUnknown:
			if s.Owner == 0 {
				return []any{s, state{Owner: i.Variant}}
			}
			return []any{s}
		case opLedger:
			ok := false
			switch {
			case s.Status == 201:
				ok = o.Captured == 1
			case s.Status == 402:
				ok = o.Captured == 0
			case s.Owner == 0:
				ok = o.Captured == 0 && o.Declined == 0
			default: // owned, outcome never learnt
				ok = o.Captured <= 1
			}
			if ok {
				return []any{s}
			}
			return nil
		}
		return nil // outOther
	},
	DescribeOperation: func(in, out any) string {
		i, o := in.(input), out.(output)
		if i.Kind == opLedger {
			return fmt.Sprintf("ledger → %d captured, %d declined", o.Captured, o.Declined)
		}
		req := "request A"
		if i.Variant == 2 {
			req = "request B (same key, other body)"
		}
		switch o.Kind {
		case outFinal, outReused, outOther:
			return fmt.Sprintf("%s %s → %d %s", i.Via, req, o.Status, abbreviate(o.Body))
		}
		return fmt.Sprintf("%s %s → unknown (%s)", i.Via, req, o.Err)
	},
	DescribeState: func(st any) string {
		s := st.(state)
		if s.Owner == 0 {
			return "key free"
		}
		if s.Status == 0 {
			return fmt.Sprintf("key owned by request %c, answer not yet known", 'A'+s.Owner-1)
		}
		return fmt.Sprintf("request %c: stored %d %s", 'A'+s.Owner-1, s.Status, abbreviate(s.Body))
	},
}

func abbreviate(s string) string {
	if len(s) > 160 {
		return s[:160] + "…"
	}
	return s
}

// anomaly is one intent whose history the model refuses.
type anomaly struct {
	Intent *intent
	Ops    []record
	HTML   string // porcupine's visualisation, when written
}

func (a anomaly) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "intent %s (order %d, token %s, via %s): not linearizable", a.Intent.Key, a.Intent.Order, a.Intent.Token, a.Intent.Via)
	if a.HTML != "" {
		fmt.Fprintf(&b, "; visualisation %s", a.HTML)
	}
	for _, r := range a.Ops {
		fmt.Fprintf(&b, "\n    [%8.3fs %8.3fs] client %d %s", float64(r.Call)/1e9, float64(r.Ret)/1e9, r.Client, model.DescribeOperation(r.In, r.Out))
	}
	return b.String()
}

// check runs porcupine on each intent's operations and returns the
// anomalies; for the first few it writes porcupine's HTML visualisation
// into dir, with the nemesis's faults as annotations.
func check(intents []*intent, recs []record, faults []fault, dir string) []anomaly {
	byIntent := map[int][]record{}
	for _, r := range recs {
		byIntent[r.Intent] = append(byIntent[r.Intent], r)
	}
	m := model.ToModel()
	var out []anomaly
	for _, in := range intents {
		rs := byIntent[in.ID]
		sort.Slice(rs, func(i, j int) bool { return rs[i].Call < rs[j].Call })
		ops := make([]porcupine.Operation, len(rs))
		for i, r := range rs {
			ops[i] = porcupine.Operation{ClientId: i, Input: r.In, Output: r.Out, Call: r.Call, Return: r.Ret}
		}
		res, info := porcupine.CheckOperationsVerbose(m, ops, time.Minute)
		if res == porcupine.Ok {
			continue
		}
		a := anomaly{Intent: in, Ops: rs}
		if len(out) < 20 && dir != "" {
			info.AddAnnotations(annotations(faults, rs, len(rs)))
			path := filepath.Join(dir, "anomaly-"+sanitize(in.Key)+".html")
			if err := porcupine.VisualizePath(m, info, path); err == nil {
				a.HTML = path
			} else {
				fmt.Fprintf(os.Stderr, "chaos: writing %s: %v\n", path, err)
			}
		}
		out = append(out, a)
	}
	return out
}

// annotations shows the faults that overlapped the intent's operations,
// on a row below its clients.
func annotations(faults []fault, rs []record, row int) []porcupine.Annotation {
	if len(rs) == 0 {
		return nil
	}
	lo, hi := rs[0].Call, rs[0].Ret
	for _, r := range rs {
		lo, hi = min(lo, r.Call), max(hi, r.Ret)
	}
	var out []porcupine.Annotation
	for _, f := range faults {
		if f.End < lo || f.Start > hi {
			continue
		}
		out = append(out, porcupine.Annotation{ClientId: row, Tag: "nemesis", Start: f.Start, End: max(f.End, f.Start+1),
			Description: f.Kind, Details: f.Target, BackgroundColor: "#f8d7da"})
	}
	return out
}

func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, s)
}
