package racedemo

import (
	"bufio"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// The picture's geometry, in SVG user units (pixels at 1x).
const (
	svgWidth    = 1200
	svgLabelX   = 196 // right edge of the lane labels
	svgPlotX    = 206 // where t=0 is drawn
	svgPlotW    = 700 // the longest intent spans this
	svgLaneH    = 22
	svgLanePad  = 8
	svgPanelGap = 26
	svgFont     = "DejaVu Sans, Helvetica, Arial, sans-serif"
)

// The colours of the phases, one per bar kind, and of the rest.
const (
	colCheck    = "#4e79a7"
	colPause    = "#bab0ac"
	colInsert   = "#b07aa1"
	colAcquirer = "#f28e2b"
	colResponse = "#59a14f"
	colInFlight = "#ececec"
	colTx       = "#222222"
	colCharged  = "#c0392b"
	colText     = "#222222"
	colMuted    = "#666666"
)

// WriteSVG draws, from the recorded timings, one contended intent of every
// run as a timeline: a lane per attempt with its check, pause, insert,
// acquirer call and stored response as coloured bars over a grey band for
// the time the client waited, a tick where it got its answer, and one time
// axis shared by every panel so their lengths compare. The intent shown is
// a doubly charged one when the run charged any intent twice, otherwise the
// one whose retry wait is nearest the run's median.
func WriteSVG(w io.Writer, results []*Result) error {
	bw := bufio.NewWriter(w)
	type panel struct {
		r      *Result
		intent int
		origin time.Duration
	}
	var panels []panel
	var span time.Duration
	for _, r := range results {
		i := pickIntent(r)
		if i < 0 {
			continue
		}
		as := r.IntentAttempts(i)
		origin := as[0].Start
		for _, a := range as {
			origin = min(origin, a.Start)
		}
		for _, a := range as {
			span = max(span, a.Done-origin)
		}
		panels = append(panels, panel{r, i, origin})
	}
	if len(panels) == 0 {
		return fmt.Errorf("racedemo: no run has an intent to draw")
	}
	step := tickStep(span)
	axisEnd := time.Duration(math.Ceil(float64(span)/float64(step))) * step
	x := func(d time.Duration) float64 {
		return svgPlotX + float64(d)/float64(axisEnd)*svgPlotW
	}

	// Each panel: two header lines, its lanes, the axis (see writePanel).
	height := 118
	for _, p := range panels {
		height += 50 + p.r.Options.Attempts*(svgLaneH+svgLanePad) + 28 + svgPanelGap
	}
	footerY := height + 2
	height += 16

	r0 := panels[0].r
	fmt.Fprintf(bw, `<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="%s" font-size="12" fill="%s">
<rect width="100%%" height="100%%" fill="#ffffff"/>
`, svgWidth, height, svgWidth, height, svgFont, colText)
	fmt.Fprintf(bw, `<text x="20" y="32" font-size="20" font-weight="bold">%s</text>
`, esc("chargeonce race: one contended intent per strategy"))
	apart := "starting together"
	if r0.Stagger > 0 {
		apart = r0.Stagger.String() + " apart"
	}
	fmt.Fprintf(bw, `<text x="20" y="54" fill="%s">%s</text>
`, colMuted, esc(fmt.Sprintf("Measured on %s: %d intents × %d concurrent attempts (%s) over %d instances, one connection pool each; simulated acquirer latency %s. Each lane is one attempt.",
		r0.Dialect, r0.Intents, r0.Options.Attempts, apart, r0.Instances, FormatDuration(r0.Latency))))
	writeLegend(bw, 20, 78)

	y := 118
	for _, p := range panels {
		y = writePanel(bw, p.r, p.intent, p.origin, y, x, step, axisEnd)
		y += svgPanelGap
	}
	fmt.Fprintf(bw, `<text x="20" y="%d" font-size="11" fill="%s">%s</text>
`, footerY, colMuted, esc("Every bar is a recorded timing, not a drawing: chargeonce race --svg FILE draws it from its own run; --csv FILE writes every attempt's numbers."))
	fmt.Fprintln(bw, "</svg>")
	return bw.Flush()
}

// writeLegend draws the key to the colours at (x0, y0).
func writeLegend(w io.Writer, x0, y0 int) {
	items := []struct{ kind, colour, label string }{
		{"bar", colCheck, "check (SELECT)"},
		{"bar", colPause, "pause / barrier"},
		{"bar", colInsert, "insert (incl. lock wait)"},
		{"bar", colAcquirer, "acquirer call"},
		{"bar", colResponse, "store response / commit"},
		{"band", colInFlight, "client waiting"},
		{"line", colTx, "transaction open"},
		{"tick", colText, "answer"},
	}
	x := x0
	for _, it := range items {
		fmt.Fprintf(w, `<g class="legend">`)
		switch it.kind {
		case "bar":
			fmt.Fprintf(w, `<rect x="%d" y="%d" width="18" height="12" rx="2" fill="%s"/>`, x, y0-10, it.colour)
		case "band":
			fmt.Fprintf(w, `<rect x="%d" y="%d" width="18" height="16" fill="%s"/>`, x, y0-12, it.colour)
		case "line":
			fmt.Fprintf(w, `<rect x="%d" y="%d" width="18" height="3" fill="%s"/>`, x, y0-2, it.colour)
		case "tick":
			fmt.Fprintf(w, `<rect x="%d" y="%d" width="2.5" height="16" fill="%s"/>`, x+8, y0-12, it.colour)
		}
		fmt.Fprintf(w, `<text x="%d" y="%d">%s</text></g>
`, x+24, y0, esc(it.label))
		x += 24 + int(textWidth(it.label)) + 22
	}
}

// writePanel draws one run's intent from y and returns where it ended.
func writePanel(w io.Writer, r *Result, i int, origin time.Duration, y int, x func(time.Duration) float64, step, axisEnd time.Duration) int {
	as := r.IntentAttempts(i)
	first := r.First(i)
	captures := r.CapturesPerIntent[i]
	var waited time.Duration
	for j, a := range as {
		if j != first {
			waited = max(waited, a.Wait())
		}
	}
	charged := "not charged"
	switch captures {
	case 1:
		charged = "charged once"
	case 2:
		charged = "charged twice"
	default:
		if captures > 2 {
			charged = fmt.Sprintf("charged %d times", captures)
		}
	}
	titleColour := colText
	if captures > 1 {
		titleColour = colCharged
	}
	fmt.Fprintf(w, `<g class="panel" data-strategy="%s" data-intent="%d">
`, esc(r.Label()), i+1)
	fmt.Fprintf(w, `<text x="20" y="%d"><tspan font-size="15" font-weight="bold">%s</tspan><tspan dx="12" fill="%s">%s</tspan></text>
`, y+16, esc(r.Label()), colMuted, esc(describe(&r.Options)))
	fmt.Fprintf(w, `<text x="20" y="%d" font-size="13"><tspan fill="%s" font-weight="bold">%s</tspan><tspan dx="6" fill="%s">%s</tspan></text>
`, y+36, titleColour, esc(charged), colMuted,
		esc(fmt.Sprintf("· intent %d of %d shown · %d of %d intents charged more than once · this intent's slowest retry answered after %s",
			i+1, r.Intents, r.DoubleCharges(), r.Intents, FormatDuration(waited))))

	ly := y + 50
	for j, a := range as {
		role := "retry"
		if j == first {
			role = "first"
		}
		fmt.Fprintf(w, `<g class="lane" data-strategy="%s" data-intent="%d" data-attempt="%d">`, esc(r.Label()), i+1, j+1)
		fmt.Fprintf(w, `<text x="%d" y="%d" text-anchor="end">%s</text>`, svgLabelX, ly+15,
			esc(fmt.Sprintf("attempt %d · instance %s · %s", j+1, instanceName(a.Instance), role)))
		fmt.Fprintf(w, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s"><title>%s</title></rect>`,
			x(a.Start-origin), ly, max(x(a.Done-origin)-x(a.Start-origin), 1), svgLaneH, colInFlight,
			esc("client waiting "+FormatDuration(a.Wait())))
		for _, ph := range []struct {
			name   string
			s      Span
			colour string
		}{
			{"check", a.Check, colCheck},
			{"pause", a.Pause, colPause},
			{"insert", a.Insert, colInsert},
			{"acquirer call", a.Acquirer, colAcquirer},
			{"store response", a.Response, colResponse},
		} {
			if !ph.s.Valid() {
				continue
			}
			x0, x1 := x(ph.s.From-origin), x(ph.s.To-origin)
			fmt.Fprintf(w, `<rect class="phase" x="%.1f" y="%d" width="%.1f" height="%d" rx="2" fill="%s"><title>%s</title></rect>`,
				x0, ly+4, max(x1-x0, 2), svgLaneH-8, ph.colour, esc(ph.name+" "+FormatDuration(ph.s.Len())))
		}
		if a.Tx.Valid() {
			x0, x1 := x(a.Tx.From-origin), x(a.Tx.To-origin)
			fmt.Fprintf(w, `<rect x="%.1f" y="%d" width="%.1f" height="3" fill="%s"><title>%s</title></rect>`,
				x0, ly+svgLaneH-3, max(x1-x0, 1), colTx, esc("transaction open "+FormatDuration(a.Tx.Len())))
		}
		xd := x(a.Done - origin)
		fmt.Fprintf(w, `<rect x="%.1f" y="%d" width="2.5" height="%d" fill="%s"/>`, xd-1, ly-2, svgLaneH+4, colText)
		label := fmt.Sprintf("%s after %s", a.Answer, FormatDuration(a.Wait()))
		if r.Strategy == CheckThenAct && r.Pause == 0 && a.Check.Valid() {
			// Without a pause the window is a few milliseconds wide, too
			// narrow to see at this scale: say when it opened and closed.
			if a.Insert.Valid() {
				label += fmt.Sprintf(" (saw no charge at %s, inserted at %s)",
					FormatDuration(a.Check.To-origin), FormatDuration(a.Insert.To-origin))
			} else {
				label += fmt.Sprintf(" (found a charge at %s)", FormatDuration(a.Check.To-origin))
			}
		}
		if a.Err != nil {
			label = "error: " + a.Err.Error()
		}
		fmt.Fprintf(w, `<text x="%.1f" y="%d">%s`, xd+7, ly+15, esc(label))
		if a.Captured {
			fmt.Fprintf(w, `<tspan dx="6" fill="%s" font-weight="bold">· charged</tspan>`, colCharged)
		}
		fmt.Fprintln(w, `</text></g>`)
		ly += svgLaneH + svgLanePad
	}

	// The time axis, the same for every panel.
	ay := ly + 2
	fmt.Fprintf(w, `<g class="axis"><rect x="%d" y="%d" width="%d" height="1" fill="%s"/>`, svgPlotX, ay, svgPlotW, colMuted)
	for t := time.Duration(0); t <= axisEnd; t += step {
		tx := x(t)
		fmt.Fprintf(w, `<rect x="%.1f" y="%d" width="1" height="5" fill="%s"/><text x="%.1f" y="%d" font-size="11" text-anchor="middle" fill="%s">%s</text>`,
			tx, ay, colMuted, tx, ay+17, colMuted, esc(tickLabel(t, axisEnd)))
	}
	fmt.Fprintf(w, `<text x="%d" y="%d" font-size="11" fill="%s">time since the intent's first attempt</text></g>
</g>
`, svgPlotX+svgPlotW+30, ay+17, colMuted)
	return ay + 26
}

// pickIntent chooses the intent of r to draw: one that the acquirer charged
// most often when r charged any intent twice, otherwise the one whose
// slowest retry is nearest r's median retry wait. Intents with a failed
// attempt are passed over when possible; -1 when r has no contended intent.
func pickIntent(r *Result) int {
	if r.Options.Attempts < 2 || r.Intents == 0 {
		return -1
	}
	clean := func(i int) bool {
		for _, a := range r.IntentAttempts(i) {
			if a.Err != nil {
				return false
			}
		}
		return true
	}
	best, bestCaptures := -1, 1
	for i := 0; i < r.Intents; i++ {
		if c := r.CapturesPerIntent[i]; c > bestCaptures && clean(i) {
			best, bestCaptures = i, c
		}
	}
	if best >= 0 {
		return best
	}
	median := Percentile(r.RetryWaits(), 0.5)
	bestDist := time.Duration(math.MaxInt64)
	for i := 0; i < r.Intents; i++ {
		if !clean(i) {
			continue
		}
		first := r.First(i)
		var slowest time.Duration
		for j, a := range r.IntentAttempts(i) {
			if j != first {
				slowest = max(slowest, a.Wait())
			}
		}
		if d := (slowest - median).Abs(); d < bestDist {
			best, bestDist = i, d
		}
	}
	if best < 0 {
		return 0
	}
	return best
}

// tickStep picks a 1-2-5 step giving at most ten ticks over span.
func tickStep(span time.Duration) time.Duration {
	span = max(span, time.Millisecond)
	for unit := time.Millisecond; ; unit *= 10 {
		for _, m := range []int64{1, 2, 5} {
			if s := time.Duration(m) * unit; span/s <= 10 {
				return s
			}
		}
	}
}

func tickLabel(t, axisEnd time.Duration) string {
	if t == 0 {
		return "0"
	}
	if axisEnd >= time.Second {
		return strconv.FormatFloat(t.Seconds(), 'f', -1, 64) + " s"
	}
	return strconv.FormatInt(t.Milliseconds(), 10) + " ms"
}

// textWidth estimates the width of s at 12px in DejaVu Sans, to lay the
// legend out without measuring fonts.
func textWidth(s string) float64 {
	w := 0.0
	for _, c := range s {
		switch {
		case strings.ContainsRune("il.,:;|!'()[] ", c):
			w += 3.9
		case strings.ContainsRune("ftrjI/", c):
			w += 4.8
		case strings.ContainsRune("mwMW", c):
			w += 10.5
		case c >= 'A' && c <= 'Z':
			w += 8.2
		default:
			w += 7.2
		}
	}
	return w
}

// describe says in one line what a strategy does.
func describe(o *Options) string {
	switch o.Strategy {
	case CheckThenAct:
		d := "SELECT the order's charge; if none, INSERT in a separate statement (no unique constraint)"
		if o.Pause > 0 {
			d += ", sleeping " + o.Pause.String() + " in between"
		}
		return d
	case LockedTransaction:
		return "INSERT … ON CONFLICT DO NOTHING on a unique key, in a transaction held open across the acquirer call"
	case InsertFirst:
		return "chargeonce's engine: INSERT … ON CONFLICT DO NOTHING, committed before the acquirer call"
	}
	return ""
}

func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}
