package pgtest_test

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/chargeonce/chargeonce/internal/pgtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(pgtest.M(m)) }

func connect(t *testing.T, u string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatalf("connecting: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func currentSchema(t *testing.T, conn *pgx.Conn) string {
	t.Helper()
	var s *string
	if err := conn.QueryRow(context.Background(), "SELECT current_schema()").Scan(&s); err != nil {
		t.Fatal(err)
	}
	if s == nil {
		t.Fatal("current_schema() is NULL: the search_path schema does not exist")
	}
	return *s
}

func schemaExists(t *testing.T, name string) bool {
	t.Helper()
	conn := connect(t, pgtest.AdminURL(t))
	var ok bool
	err := conn.QueryRow(context.Background(),
		"SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", name).Scan(&ok)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// TestURLIsolated checks that two tests' URLs lead to different, empty
// schemas and that unqualified tables land in them.
func TestURLIsolated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := connect(t, pgtest.URL(t)), connect(t, pgtest.URL(t))

	sa, sb := currentSchema(t, a), currentSchema(t, b)
	if sa == sb {
		t.Fatalf("both URLs use schema %s", sa)
	}
	if _, err := a.Exec(ctx, "CREATE TABLE widgets (id int PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Exec(ctx, "INSERT INTO widgets VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := a.QueryRow(ctx, "SELECT count(*) FROM "+sa+".widgets").Scan(&n); err != nil || n != 1 {
		t.Fatalf("widgets not in %s: n=%d err=%v", sa, n, err)
	}
	_, err := b.Exec(ctx, "SELECT * FROM widgets")
	if err == nil {
		t.Fatalf("schema %s sees schema %s's table", sb, sa)
	}
	var tables int
	if err := b.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE schemaname = $1", sb).Scan(&tables); err != nil || tables != 0 {
		t.Fatalf("fresh schema %s has %d tables (err %v)", sb, tables, err)
	}
}

// TestURLDroppedAtCleanup checks that the schema disappears when its test
// ends, with the objects created in it.
func TestURLDroppedAtCleanup(t *testing.T) {
	t.Parallel()
	var schema string
	t.Run("inner", func(t *testing.T) {
		conn := connect(t, pgtest.URL(t)) // closed before the schema is dropped
		schema = currentSchema(t, conn)
		if _, err := conn.Exec(context.Background(), "CREATE TABLE widgets (id int)"); err != nil {
			t.Fatal(err)
		}
	})
	if schema == "" {
		t.Fatal("inner test did not run")
	}
	if schemaExists(t, schema) {
		t.Fatalf("schema %s still exists after its test ended", schema)
	}
}

// TestURLKeepsQuery checks that search_path is added to the server URL
// without losing its other parameters.
func TestURLKeepsQuery(t *testing.T) {
	t.Parallel()
	admin, err := url.Parse(pgtest.AdminURL(t))
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	if u.Host != admin.Host || u.Path != admin.Path {
		t.Fatalf("URL %s does not point at server %s", u.Redacted(), admin.Redacted())
	}
	for k, v := range admin.Query() {
		if k != "search_path" && u.Query().Get(k) != v[0] {
			t.Errorf("URL lost parameter %s=%s", k, v[0])
		}
	}
	if sp := u.Query().Get("search_path"); len(sp) < 3 || sp[:2] != "t_" {
		t.Errorf("search_path = %q, want t_<random>", sp)
	}
}

// TestAdminURL checks that the admin URL reaches the server with the
// privileges tests rely on (seeing and terminating other backends).
func TestAdminURL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	victim := connect(t, pgtest.URL(t))
	var pid uint32
	if err := victim.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	admin := connect(t, pgtest.AdminURL(t))
	var ok bool
	if err := admin.QueryRow(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend: %v %v", ok, err)
	}
	_, err := victim.Exec(ctx, "SELECT 1")
	if err == nil {
		t.Fatal("terminated connection still works")
	}
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("unexpected timeout: %v", err)
	}
}
