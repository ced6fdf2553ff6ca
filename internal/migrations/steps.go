package migrations

import (
	"fmt"
	"strings"
)

// StepKind says how a store runs one step of a migration.
type StepKind int

const (
	// StepTx runs in a transaction of its own that waits only briefly for
	// its locks (the store's lock timeout) and is retried when it cannot
	// have them. DDL goes here: its ACCESS EXCLUSIVE lock is held for the
	// catalog change only, never for a scan.
	StepTx StepKind = iota
	// StepBackfill is an UPDATE (or DELETE) that the store repeats over
	// consecutive ranges of the table's pages, each range in a transaction
	// of its own: $1 and $2 are the first ctid of the range and the first
	// ctid past it, so the statement says WHERE ctid >= $1 AND ctid < $2
	// AND …. It runs after the DDL before it has committed, and must be
	// idempotent (its WHERE excludes rows already done), since a crashed
	// migration resumes from the last range committed.
	StepBackfill
	// StepNoTx runs outside any transaction, as CREATE INDEX CONCURRENTLY
	// must. It must be idempotent (IF NOT EXISTS), since a crash between
	// running it and recording it runs it again.
	StepNoTx
)

// The directives of a migration file, each on a line of its own; each begins
// a step that runs to the next directive or the end of the file. Text before
// the first directive is a StepTx of its own unless it is only comments.
// A file with no directive is one StepTx (every SQLite migration).
const (
	directive         = "-- chargeonce:"
	directiveStep     = "step"
	directiveBackfill = "backfill" // followed by the table's name
	directiveNoTx     = "no-transaction"
)

// Step is one part of a migration, run and recorded on its own.
type Step struct {
	Kind StepKind
	// Table is the table a StepBackfill walks.
	Table string
	SQL   string
}

// Steps splits m at its directives.
func (m Migration) Steps() ([]Step, error) {
	var (
		steps []Step
		cur   = Step{Kind: StepTx}
		body  strings.Builder
	)
	flush := func() {
		cur.SQL = strings.TrimSpace(body.String())
		if hasStatement(cur.SQL) {
			steps = append(steps, cur)
		}
		body.Reset()
	}
	for line := range strings.Lines(m.SQL) {
		d, ok := strings.CutPrefix(strings.TrimSpace(line), directive)
		if !ok {
			body.WriteString(line)
			continue
		}
		flush()
		word, arg, _ := strings.Cut(strings.TrimSpace(d), " ")
		arg = strings.TrimSpace(arg)
		switch {
		case word == directiveStep && arg == "":
			cur = Step{Kind: StepTx}
		case word == directiveNoTx && arg == "":
			cur = Step{Kind: StepNoTx}
		case word == directiveBackfill && arg != "" && !strings.ContainsAny(arg, " \t"):
			cur = Step{Kind: StepBackfill, Table: arg}
		default:
			return nil, fmt.Errorf("migration %s: unknown directive %q (want %sstep, %sbackfill TABLE or %sno-transaction)",
				m.Name, strings.TrimSpace(line), directive, directive, directive)
		}
	}
	flush()
	for i, s := range steps {
		if s.Kind == StepBackfill && (!strings.Contains(s.SQL, "$1") || !strings.Contains(s.SQL, "$2")) {
			return nil, fmt.Errorf("migration %s: backfill step %d must bound its rows with ctid >= $1 AND ctid < $2", m.Name, i)
		}
	}
	return steps, nil
}

// hasStatement reports whether sql holds more than comments and blanks.
func hasStatement(sql string) bool {
	for line := range strings.Lines(sql) {
		l := strings.TrimSpace(line)
		if l != "" && !strings.HasPrefix(l, "--") {
			return true
		}
	}
	return false
}
