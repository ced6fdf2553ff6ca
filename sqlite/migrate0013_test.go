package sqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
)

// TestMigration0013OnData: a file at 0012 where redeliveries queued an
// event three times to one endpoint and twice to another, beside a
// delivery done and one pending alone: after Migrate each (event,
// endpoint) has one pending delivery, the oldest, the others failed, and a
// fourth pending one is refused.
func TestMigration0013OnData(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	schemaAt(t, db, 12)
	if _, err := db.ExecContext(ctx, `INSERT INTO webhook_deliveries (event_id, endpoint_id, merchant_id, state, next_at, created_at) VALUES
		('evt_a', 'we_1', 'm', 'pending', 1, 1), ('evt_a', 'we_1', 'm', 'pending', 1, 1), ('evt_a', 'we_1', 'm', 'pending', 1, 1),
		('evt_a', 'we_2', 'm', 'pending', 1, 1), ('evt_a', 'we_2', 'm', 'pending', 1, 1),
		('evt_b', 'we_1', 'm', 'succeeded', 1, 1), ('evt_b', 'we_1', 'm', 'pending', 1, 1)`); err != nil {
		t.Fatalf("preparing the 0012 file: %v", err)
	}
	db.Close()

	openAt(t, path, true) // migrates
	db, err = sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.QueryContext(ctx, `SELECT state FROM webhook_deliveries ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		got = append(got, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	want := []string{"pending", "failed", "failed", "pending", "failed", "succeeded", "pending"}
	if len(got) != len(want) {
		t.Fatalf("deliveries after Migrate: %v; want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("deliveries after Migrate: %v; want %v", got, want)
		}
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO webhook_deliveries (event_id, endpoint_id, merchant_id, next_at, created_at) VALUES ('evt_a', 'we_1', 'm', 1, 1)`); err == nil {
		t.Fatal("a second pending delivery of evt_a to we_1 was accepted")
	}
}
