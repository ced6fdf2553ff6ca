package racedemo

import (
	"encoding/csv"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"
)

// WriteTable writes one row per run: intents, attempts, captures (money
// the acquirer moved), double charges (intents captured more than once),
// the retry's wait (p50, p99, max) and failed attempts.
func WriteTable(w io.Writer, results []*Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "strategy\tintents\tattempts\tcaptures\tdouble charges\tretry wait p50\tp99\tmax\terrors\t")
	for _, r := range results {
		waits := r.RetryWaits()
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%d\t\n",
			r.Label(), r.Intents, len(r.Attempts), r.Captures, r.DoubleCharges(),
			FormatDuration(Percentile(waits, 0.50)), FormatDuration(Percentile(waits, 0.99)),
			FormatDuration(Percentile(waits, 1)), r.Errors())
	}
	return tw.Flush()
}

// WriteFindings writes what the numbers say, one line per run, in words
// derived from the numbers themselves (never from the strategy's name).
func WriteFindings(w io.Writer, results []*Result) {
	for _, r := range results {
		waits := r.RetryWaits()
		p50, p99 := Percentile(waits, 0.50), Percentile(waits, 0.99)
		var charged string
		switch d := r.DoubleCharges(); {
		case d > 0:
			charged = fmt.Sprintf("%d of %d contended intents charged more than once (%d captures for %d intents)",
				d, r.ContendedIntents(), r.Captures, r.Intents)
		case r.Captures == int64(r.Intents):
			charged = "every intent charged exactly once"
		default:
			charged = fmt.Sprintf("%d captures for %d intents", r.Captures, r.Intents)
		}
		// Whether a retry waited for the acquirer is read off the
		// timings: did it answer before or after the first attempt's
		// acquirer call ended?
		retries, recharged, afterFirst := 0, 0, 0
		for i := 0; i < r.Intents; i++ {
			first := r.First(i)
			for j, a := range r.IntentAttempts(i) {
				if j == first || a.Err != nil {
					continue
				}
				retries++
				if a.Captured {
					recharged++
				}
				if first >= 0 {
					if f := r.IntentAttempts(i)[first]; f.Acquirer.Valid() && a.Done >= f.Acquirer.To {
						afterFirst++
					}
				}
			}
		}
		took := fmt.Sprintf("p50 %s, p99 %s, for an acquirer call of %s",
			FormatDuration(p50), FormatDuration(p99), FormatDuration(r.Latency))
		var waited string
		switch {
		case retries == 0:
			waited = "no retry got an answer"
		case recharged > 0:
			waited = fmt.Sprintf("%d of %d retries charged again instead of finding the first charge (answered after %s)",
				recharged, retries, took)
		case afterFirst == retries:
			waited = "every retry waited until the first attempt's acquirer call had ended: " + took
		case afterFirst == 0:
			waited = "every retry had its answer before the first attempt's acquirer call ended: " + took
		default:
			waited = fmt.Sprintf("%d of %d retries waited until the first attempt's acquirer call had ended: %s",
				afterFirst, retries, took)
		}
		fmt.Fprintf(w, "  %s: %s; %s.\n", r.Label(), charged, waited)
		if n := r.Errors(); n > 0 {
			fmt.Fprintf(w, "    %d attempts failed; the first: %v\n", n, r.FirstError())
		}
	}
}

// WriteCSV writes every attempt's timings, in milliseconds from the run's
// common start, one row per attempt.
func WriteCSV(w io.Writer, results []*Result) error {
	cw := csv.NewWriter(w)
	_ = cw.Write([]string{"strategy", "intent", "attempt", "instance", "start_ms",
		"check_from_ms", "check_to_ms", "pause_from_ms", "pause_to_ms",
		"insert_from_ms", "insert_to_ms", "acquirer_from_ms", "acquirer_to_ms",
		"response_from_ms", "response_to_ms", "answer_ms", "answer", "first", "captured", "error"})
	for _, r := range results {
		for i := 0; i < r.Intents; i++ {
			first := r.First(i)
			for j, a := range r.IntentAttempts(i) {
				errText := ""
				if a.Err != nil {
					errText = a.Err.Error()
				}
				row := []string{r.Label(), strconv.Itoa(i + 1), strconv.Itoa(j + 1), instanceName(a.Instance), ms(a.Start)}
				for _, s := range []Span{a.Check, a.Pause, a.Insert, a.Acquirer, a.Response} {
					if s.Valid() {
						row = append(row, ms(s.From), ms(s.To))
					} else {
						row = append(row, "", "")
					}
				}
				row = append(row, ms(a.Done), a.Answer, strconv.FormatBool(j == first), strconv.FormatBool(a.Captured), errText)
				_ = cw.Write(row)
			}
		}
	}
	cw.Flush()
	return cw.Error()
}

func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 3, 64)
}

// FormatDuration prints d with a precision that suits a latency: 1.23ms,
// 203ms, 1.20s.
func FormatDuration(d time.Duration) string {
	switch {
	case d == 0:
		return "0"
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
	case d < time.Second:
		return fmt.Sprintf("%.0fms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.2fs", d.Seconds())
	}
}
