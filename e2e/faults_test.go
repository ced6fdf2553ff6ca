package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/internal/pgtest"
)

// TestFaultTokensCaptureOnce: tok_fail_before (503, nothing captured),
// tok_fail_after (captured, reply lost) and tok_slow (slower than the
// acquirer timeout) each first answer 202; retries and recovery then end
// each with 201 and exactly one capture under the charge's reference.
func TestFaultTokensCaptureOnce(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	ps := newProcs(t)
	acq := ps.startAcquirer("acquirer", "--slow", "1500ms")
	flags := []string{"--lease", "2s", "--acquirer-timeout", "500ms", "--reconcile-every", "200ms"}
	dbURL := withParams(url, "pool_max_conns", "4")
	a := ps.start("serve-a", serveArgs(dbURL, acq.URL(), flags...)...)
	b := ps.start("serve-b", serveArgs(dbURL, acq.URL(), flags...)...)
	ac := acquirerClient(acq)
	bases := func() []string { return []string{b.URL(), a.URL()} }

	for _, token := range []string{"tok_fail_before", "tok_fail_after", "tok_slow"} {
		t.Run(token, func(t *testing.T) {
			t.Parallel()
			order := newOrder()
			key := uniqueName(token + "-")
			body := chargeBody(order, token)
			start := time.Now()
			first := charge(&http.Client{Timeout: 30 * time.Second}, a.URL(), key, body)
			if first.err != nil || first.status != 202 {
				t.Fatalf("first answer %s; want 202 (outcome unknown)", first)
			}
			pending := decodeCharge(t, first.body)
			if pending.Status != "processing" {
				t.Fatalf("202 body %s; want the charge processing", first.body)
			}
			final, trail := untilFinal(t, 60*time.Second, bases, key, body)
			if final.status != 201 {
				t.Fatalf("final answer %s; want 201", final)
			}
			ch := decodeCharge(t, final.body)
			if ch.ID != pending.ID || ch.Status != "captured" {
				t.Fatalf("final charge %+v; want %s captured", ch, pending.ID)
			}
			wantReplays(t, bases(), key, body, final)
			wantOneCapture(t, ac, order, ch.ID)
			if list := listCharges(t, a.URL(), order); len(list) != 1 || list[0].Status != "captured" {
				t.Fatalf("stored charges %+v; want one, captured", list)
			}
			t.Logf("202, then 201 after %v and answers %v", time.Since(start).Round(time.Millisecond), statuses(trail))
		})
	}
}

// TestWriteConnectionKilled: the database connection that is storing the
// acquirer's answer is killed (pg_terminate_backend) mid-write. The write
// is retried on a fresh connection: the client gets its 201 at once, and
// the acquirer holds one capture.
//
// To hit the window between the acquirer's answer and the response write
// every time, a trigger makes that one write (the first completion this
// instance stores) sleep on the server; the test kills the connection while
// it sleeps.
func TestWriteConnectionKilled(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	admin := pgtest.AdminURL(t)
	ps := newProcs(t)
	acq := ps.startAcquirer("acquirer", "--slow", "1s")
	app := uniqueName("chargeonce_a_")
	flags := []string{"--lease", "4s", "--acquirer-timeout", "3s", "--reconcile-every", "200ms"}
	a := ps.start("serve-a", serveArgs(withParams(url, "application_name", app, "pool_max_conns", "4"), acq.URL(), flags...)...)
	ac := acquirerClient(acq)
	db(t, url, func(conn *pgx.Conn) error {
		_, err := conn.Exec(t.Context(), fmt.Sprintf(`
CREATE SEQUENCE slow_writes;
CREATE FUNCTION slow_first_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	-- nextval is not rolled back with the killed transaction: only the
	-- first try of the write sleeps, its retry goes through.
	IF NEW.state = 'completed' AND current_setting('application_name') = %[1]s
	   AND nextval('slow_writes') = 1 THEN
		PERFORM pg_sleep(30);
	END IF;
	RETURN NEW;
END $$;
CREATE TRIGGER slow_first_write BEFORE UPDATE ON idempotency_keys
	FOR EACH ROW EXECUTE FUNCTION slow_first_write();`, quote(app)))
		return err
	})

	order := newOrder()
	key := uniqueName("killed-write-")
	body := chargeBody(order, "tok_slow")
	first := make(chan answer, 1)
	start := time.Now()
	go func() { first <- charge(&http.Client{Timeout: 60 * time.Second}, a.URL(), key, body) }()

	// The acquirer has answered and the write is under way: its backend
	// sleeps in the trigger.
	var pid int64
	apitest.Eventually(t, 30*time.Second, "the response write to be in flight", func() bool {
		pid = queryInt(t, admin, `
SELECT COALESCE(max(pid), 0) FROM pg_stat_activity
WHERE datname = current_database() AND application_name = $1 AND wait_event = 'PgSleep'`, app)
		return pid != 0
	})
	if list, err := ac.ListByOrder(t.Context(), order, "demo"); err != nil || len(list) != 1 {
		t.Fatalf("the acquirer has not answered yet (%v, %v)", list, err)
	}
	if n := terminate(t, admin, app); n < 1 {
		t.Fatalf("pg_terminate_backend ended %d connections of %s", n, app)
	}
	got := <-first
	if got.err != nil || got.status != 201 {
		t.Fatalf("answer %s; want 201, stored by the retried write", got)
	}
	ch := decodeCharge(t, got.body)
	wantReplays(t, []string{a.URL()}, key, body, got)
	wantOneCapture(t, ac, order, ch.ID)
	if n := queryInt(t, url, `SELECT nextval('slow_writes')`); n < 3 {
		t.Fatalf("the write ran %d times; want the killed try and its retry", n-1)
	}
	t.Logf("write connection (pid %d) killed; 201 %v after the POST", pid, time.Since(start).Round(time.Millisecond))
}

// TestConnectionsKilledDuringAcquirerCall: every database connection of the
// instance is killed again and again while its attempt waits for a slow
// capture and while it stores the answer. Whichever way it goes (the write
// retried on a fresh connection, or the record left for recovery), the
// intent ends captured once.
func TestConnectionsKilledDuringAcquirerCall(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	admin := pgtest.AdminURL(t)
	ps := newProcs(t)
	acq := ps.startAcquirer("acquirer", "--slow", "1500ms")
	app := uniqueName("chargeonce_a_")
	flags := []string{"--lease", "3s", "--acquirer-timeout", "2500ms", "--reconcile-every", "200ms"}
	a := ps.start("serve-a", serveArgs(withParams(url, "application_name", app, "pool_max_conns", "4"), acq.URL(), flags...)...)
	b := ps.start("serve-b", serveArgs(withParams(url, "pool_max_conns", "4"), acq.URL(), flags...)...)
	ac := acquirerClient(acq)

	order := newOrder()
	key := uniqueName("killed-conns-")
	body := chargeBody(order, "tok_slow")
	first := make(chan answer, 1)
	go func() { first <- charge(&http.Client{Timeout: 60 * time.Second}, a.URL(), key, body) }()
	apitest.Eventually(t, 20*time.Second, "the capture request to reach the acquirer", func() bool {
		st, err := ac.Stats(t.Context())
		return err == nil && st.CaptureRequests >= 1
	})
	var killed int64
	var got answer
	for done := false; !done; {
		killed += terminate(t, admin, app)
		select {
		case got = <-first:
			done = true
		case <-time.After(5 * time.Millisecond):
		}
	}
	if killed == 0 {
		t.Fatalf("no connection of %s was killed", app)
	}
	if got.err != nil || (got.status != 201 && got.status != 202) {
		t.Fatalf("first answer %s; want 201, or 202 when every write failed", got)
	}
	final, trail := untilFinal(t, 60*time.Second, func() []string { return []string{a.URL(), b.URL()} }, key, body)
	if final.status != 201 {
		t.Fatalf("final %s; want 201", final)
	}
	ch := decodeCharge(t, final.body)
	wantReplays(t, []string{a.URL(), b.URL()}, key, body, final)
	wantOneCapture(t, ac, order, ch.ID)
	t.Logf("%d connections killed; first answer %d, then %v", killed, got.status, statuses(trail))
}

// TestWriteFailsEveryRetry: instance A can reach the acquirer but cannot
// store an answer (a trigger refuses its completions). Its attempt answers
// 202 after trying the write every time; the record stays processing with
// the money moved; A's recovery re-drives it with the same reference and
// fails to store again, backing off; once writes work again, recovery
// settles it, which moves no money again; one capture; the retry replays the
// stored 201.
func TestWriteFailsEveryRetry(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	ps := newProcs(t)
	acq := ps.startAcquirer("acquirer")
	app := uniqueName("chargeonce_a_")
	flags := []string{"--lease", "3s", "--acquirer-timeout", "2s", "--reconcile-every", "200ms"}
	a := ps.start("serve-a", serveArgs(withParams(url, "application_name", app, "pool_max_conns", "4"), acq.URL(), flags...)...)
	ac := acquirerClient(acq)
	db(t, url, func(conn *pgx.Conn) error {
		_, err := conn.Exec(t.Context(), fmt.Sprintf(`
CREATE FUNCTION refuse_completion() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.state = 'completed' AND current_setting('application_name') = %[1]s THEN
		RAISE EXCEPTION 'injected fault: %% may not store answers', current_setting('application_name');
	END IF;
	RETURN NEW;
END $$;
CREATE TRIGGER refuse_completion BEFORE UPDATE ON idempotency_keys
	FOR EACH ROW EXECUTE FUNCTION refuse_completion();`, quote(app)))
		return err
	})

	order := newOrder()
	key := uniqueName("write-fails-")
	body := chargeBody(order, "tok_ok")
	got := charge(&http.Client{Timeout: 30 * time.Second}, a.URL(), key, body)
	if got.err != nil || got.status != 202 {
		t.Fatalf("answer %s; want 202 (the answer could not be stored)", got)
	}
	ch := decodeCharge(t, got.body)
	wantOneCapture(t, ac, order, ch.ID) // the money moved
	var state string
	db(t, url, func(conn *pgx.Conn) error {
		return conn.QueryRow(t.Context(), `SELECT state FROM idempotency_keys WHERE key = $1`, key).Scan(&state)
	})
	if state != "processing" {
		t.Fatalf("record is %s; want processing until recovery settles it", state)
	}
	if n := strings.Count(a.logText(), "storing the acquirer's answer failed"); n < 1 {
		t.Fatalf("A did not log the failed write")
	}

	// A's own recovery keeps failing to store the answer, with back-off.
	apitest.Eventually(t, 30*time.Second, "A's recovery to try and fail", func() bool {
		return queryInt(t, url, `SELECT recovery_attempts FROM idempotency_keys WHERE key = $1`, key) >= 1
	})
	// The database takes A's writes again (as after a restart), and a
	// second instance joins: whichever recovery loop, or the client's
	// retry, gets to the record next finishes the charge.
	db(t, url, func(conn *pgx.Conn) error {
		_, err := conn.Exec(t.Context(), `DROP TRIGGER refuse_completion ON idempotency_keys`)
		return err
	})
	b := ps.start("serve-b", serveArgs(withParams(url, "pool_max_conns", "4"), acq.URL(), flags...)...)
	final, trail := untilFinal(t, 60*time.Second, func() []string { return []string{b.URL()} }, key, body)
	if final.status != 201 || decodeCharge(t, final.body).ID != ch.ID {
		t.Fatalf("final %s; want 201 for charge %s", final, ch.ID)
	}
	wantReplays(t, []string{a.URL(), b.URL()}, key, body, final)
	wantOneCapture(t, ac, order, ch.ID)
	st, err := ac.Stats(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// Recovery looks the reference up and settles from the capture it
	// finds: the reference is never sent again.
	if st.Captures != 1 || st.CaptureRequests != 1 {
		t.Fatalf("acquirer stats %+v; want one capture request and one capture, the re-drives settled by looking the reference up", st)
	}
	t.Logf("answers on B before the final 201: %v; acquirer %+v", statuses(trail), st)
}

// TestAcquirerDown: while the acquirer process is down, every charge
// answers 202 and stays processing; recovery keeps trying with a growing
// back-off (recovery_attempts grows), the stuck-records gauge and log show
// the orphans, and no money moves. Once the acquirer is back, recovery
// settles every record; retries replay the final answers; one capture per
// approved intent.
func TestAcquirerDown(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	ps := newProcs(t)
	acq := ps.startAcquirer("acquirer")
	acqAddr := acq.Addr()
	acq.kill()
	flags := []string{"--lease", "2s", "--acquirer-timeout", "1s", "--reconcile-every", "200ms"}
	a := ps.start("serve-a", serveArgs(withParams(url, "pool_max_conns", "4"), acq.URL(), flags...)...)
	b := ps.start("serve-b", serveArgs(withParams(url, "pool_max_conns", "4"), acq.URL(), flags...)...)
	bases := []string{a.URL(), b.URL()}

	tokens := []string{"tok_ok", "tok_ok", "tok_fail_after", "tok_declined"}
	keys := make([]string, len(tokens))
	bodies := make([][]byte, len(tokens))
	orders := make([]int64, len(tokens))
	c := &http.Client{Timeout: 30 * time.Second}
	for i, tok := range tokens {
		orders[i], keys[i] = newOrder(), uniqueName("down-")
		bodies[i] = chargeBody(orders[i], tok)
		if got := charge(c, bases[i%2], keys[i], bodies[i]); got.err != nil || got.status != 202 {
			t.Fatalf("%s during the outage: %s; want 202", tok, got)
		}
	}
	processing := func() int64 {
		return queryInt(t, url, `SELECT count(*) FROM idempotency_keys WHERE state = 'processing'`)
	}
	// Recovery tries, fails, backs off: attempts grow, nothing settles.
	apitest.Eventually(t, 30*time.Second, "recovery to retry every record at least twice", func() bool {
		return queryInt(t, url, `SELECT min(recovery_attempts) FROM idempotency_keys`) >= 2
	})
	if n := processing(); n != int64(len(tokens)) {
		t.Fatalf("%d records processing during the outage, want %d", n, len(tokens))
	}
	// Operators see the orphans: the gauge on every instance (each runs
	// recovery) and the recovery log line.
	for _, base := range bases {
		apitest.Eventually(t, 30*time.Second, "the stuck-records gauge to count every record", func() bool {
			v, ok := metric(t, base, "chargeonce_stuck_records")
			return ok && v == float64(len(tokens))
		})
		if v, ok := metric(t, base, "chargeonce_stuck_oldest_age_seconds"); !ok || v <= 0 {
			t.Fatalf("chargeonce_stuck_oldest_age_seconds = %v (%v); want the age of the oldest orphan", v, ok)
		}
	}
	// The log line comes from the same recovery pass as the gauge, written
	// a moment after it.
	apitest.Eventually(t, 10*time.Second, "an instance to log the stuck records", func() bool {
		return strings.Contains(a.logText()+b.logText(), fmt.Sprintf(`msg="processing records past their lease" count=%d`, len(tokens)))
	})
	// A retry during the outage gets no final answer either.
	if got := charge(c, b.URL(), keys[0], bodies[0]); got.err != nil || (got.status != 202 && got.status != 409) {
		t.Fatalf("retry during the outage: %s; want 202 or 409", got)
	}
	attempts := queryInt(t, url, `SELECT max(recovery_attempts) FROM idempotency_keys`)

	acq.restart("acquirer", "--addr", acqAddr)
	restarted := time.Now()
	apitest.Eventually(t, 60*time.Second, "recovery to settle every record", func() bool { return processing() == 0 })
	settledIn := time.Since(restarted)
	ac := acquirerClient(acq)
	for i, tok := range tokens {
		final, _ := untilFinal(t, 10*time.Second, func() []string { return bases }, keys[i], bodies[i])
		if final.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("%s: %s is not a replay of what recovery stored", tok, final)
		}
		want := 201
		if tok == "tok_declined" {
			want = 402
		}
		if final.status != want {
			t.Fatalf("%s: final %s; want %d", tok, final, want)
		}
		if want == 201 {
			wantOneCapture(t, ac, orders[i], decodeCharge(t, final.body).ID)
		}
	}
	st, err := ac.Stats(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.Captures != 3 {
		t.Fatalf("acquirer stats %+v; want 3 captures", st)
	}
	for _, base := range bases {
		apitest.Eventually(t, 30*time.Second, "the stuck-records gauge to drop to zero", func() bool {
			v, ok := metric(t, base, "chargeonce_stuck_records")
			return ok && v == 0
		})
	}
	t.Logf("up to %d recovery attempts during the outage; settled %v after the acquirer came back; acquirer %+v",
		attempts, settledIn.Round(time.Millisecond), st)
}

// quote returns s as an SQL string literal.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
