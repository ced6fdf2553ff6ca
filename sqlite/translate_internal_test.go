package sqlite

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
)

// A statement SQLite interrupts because its context ended, and a deadline
// that ends an operation, say the database was too slow now, not that the
// statement is wrong: unavailable (503, retry), never internal (500).
func TestTranslateUnavailable(t *testing.T) {
	t.Parallel()
	s, err := Open(context.Background(), filepath.Join(t.TempDir(), "translate.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	var n int64
	interrupted := s.rdb.QueryRowContext(ctx,
		"WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c").Scan(&n)
	if interrupted == nil {
		t.Fatal("an endless query returned")
	}
	for name, err := range map[string]error{
		"interrupted": interrupted,
		"deadline":    fmt.Errorf("reading: %w", context.DeadlineExceeded),
	} {
		if code := chargeonce.ErrorCode(translate(err)); code != chargeonce.EUNAVAILABLE {
			t.Errorf("%s (%v): code %s, want %s", name, err, code, chargeonce.EUNAVAILABLE)
		}
	}
	if code := chargeonce.ErrorCode(translate(fmt.Errorf("scan: wrong type"))); code != chargeonce.EINTERNAL {
		t.Errorf("a plain error: code %s, want %s", code, chargeonce.EINTERNAL)
	}
}
