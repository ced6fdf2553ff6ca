package sqlite

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// The DSN pragmas reach both pools: WAL, synchronous=FULL (a committed record
// must survive power loss), foreign keys, the busy timeout and temp_store
// MEMORY on the writer;
// read-only connections in the read pool.
func TestOpenPragmas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "pragma.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	for _, c := range []struct{ pragma, want string }{
		{"journal_mode", "wal"},
		{"synchronous", "2"}, // FULL; NORMAL (1) may lose commits on power loss
		{"foreign_keys", "1"},
		{"busy_timeout", "5000"},
		{"query_only", "0"},
		// The shared transactions' sub-journal stays in memory: spilled to
		// a temporary file, it was opened and deleted by every large group.
		{"temp_store", "2"},
	} {
		var got string
		if err := s.wdb.QueryRowContext(ctx, "PRAGMA "+c.pragma).Scan(&got); err != nil {
			t.Fatalf("PRAGMA %s: %v", c.pragma, err)
		}
		if !strings.EqualFold(got, c.want) {
			t.Errorf("writer PRAGMA %s = %s, want %s", c.pragma, got, c.want)
		}
	}
	var q string
	if err := s.rdb.QueryRowContext(ctx, "PRAGMA query_only").Scan(&q); err != nil || q != "1" {
		t.Errorf("reader PRAGMA query_only = %q, %v; want 1", q, err)
	}
	if _, err := s.rdb.ExecContext(ctx, "CREATE TABLE t (x)"); err == nil {
		t.Error("a read connection could write")
	}
	if got := s.wdb.Stats().MaxOpenConnections; got != 1 {
		t.Errorf("writer pool allows %d connections, want 1", got)
	}
}
