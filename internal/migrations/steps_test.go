package migrations

import (
	"strings"
	"testing"
)

func TestSteps(t *testing.T) {
	t.Parallel()
	m := Migration{Name: "0009_x.sql", SQL: `-- a header, only comments

-- chargeonce:step
ALTER TABLE t ADD COLUMN c int;
-- chargeonce:backfill t
UPDATE t SET c = 1 WHERE ctid >= $1 AND ctid < $2 AND c IS NULL;
-- chargeonce:no-transaction
CREATE INDEX CONCURRENTLY IF NOT EXISTS t_c ON t (c);
`}
	steps, err := m.Steps()
	if err != nil {
		t.Fatal(err)
	}
	want := []Step{
		{Kind: StepTx, SQL: "ALTER TABLE t ADD COLUMN c int;"},
		{Kind: StepBackfill, Table: "t", SQL: "UPDATE t SET c = 1 WHERE ctid >= $1 AND ctid < $2 AND c IS NULL;"},
		{Kind: StepNoTx, SQL: "CREATE INDEX CONCURRENTLY IF NOT EXISTS t_c ON t (c);"},
	}
	if len(steps) != len(want) {
		t.Fatalf("steps: %+v; want %+v", steps, want)
	}
	for i := range want {
		if steps[i] != want[i] {
			t.Errorf("step %d: %+v; want %+v", i, steps[i], want[i])
		}
	}

	plain, err := Migration{Name: "0001_init.sql", SQL: "-- c\nCREATE TABLE a (x int);\nCREATE TABLE b (y int);\n"}.Steps()
	if err != nil || len(plain) != 1 || plain[0].Kind != StepTx || !strings.Contains(plain[0].SQL, "CREATE TABLE b") {
		t.Errorf("a file without directives: %+v, %v; want one transaction step with all of it", plain, err)
	}

	for _, bad := range []string{"-- chargeonce:stepp\nSELECT 1;", "-- chargeonce:backfill\nSELECT 1;", "-- chargeonce:backfill t\nUPDATE t SET c = 1;"} {
		if _, err := (Migration{Name: "0002_bad.sql", SQL: bad}).Steps(); err == nil {
			t.Errorf("%q: no error; want one", bad)
		}
	}
}
