package admin_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/admin"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/internal/pgtest"
	"github.com/chargeonce/chargeonce/postgres"
	"github.com/chargeonce/chargeonce/recovery"
	"github.com/chargeonce/chargeonce/sqlite"
)

// The environment of a recovery pass run in a process of its own by
// TestRecoveryKilledMidCapture.
const (
	childKindEnv  = "CHARGEONCE_ADMIN_TEST_RECOVERY_KIND"
	childStoreEnv = "CHARGEONCE_ADMIN_TEST_RECOVERY_STORE"
	childLease    = 1500 * time.Millisecond
)

// hangingAcquirer answers lookups "safe to send", then says on stdout
// that it holds a capture and never answers it.
type hangingAcquirer struct{}

func (hangingAcquirer) Lookup(context.Context, chargeonce.LookupRequest) (chargeonce.LookupResult, error) {
	return chargeonce.LookupResult{Status: chargeonce.LookupSafeToSend}, nil
}

func (hangingAcquirer) Capture(ctx context.Context, req chargeonce.CaptureRequest) (chargeonce.CaptureResult, error) {
	fmt.Println("capture-sent " + req.Reference)
	<-ctx.Done()
	time.Sleep(time.Hour)
	return chargeonce.CaptureResult{}, ctx.Err()
}

// TestRecoveryPassProcess is the recovery pass that
// TestRecoveryKilledMidCapture starts in a process of its own (and
// SIGKILLs); run on its own, it does nothing.
func TestRecoveryPassProcess(t *testing.T) {
	kind, where := os.Getenv(childKindEnv), os.Getenv(childStoreEnv)
	if kind == "" {
		return
	}
	ctx := context.Background()
	var store chargeonce.Store
	var err error
	switch kind {
	case "postgres":
		store, err = postgres.Open(ctx, where)
	default:
		store, err = sqlite.Open(ctx, where)
	}
	if err != nil {
		t.Fatal(err)
	}
	eng := engine.New(store, hangingAcquirer{}, engine.Options{Lease: childLease, AcquirerTimeout: time.Hour})
	_, err = recovery.NewRescuer(store, eng, recovery.RescuerOptions{}).RunOnce(ctx)
	t.Fatalf("the recovery pass ended (%v); its capture was to hang until the process is killed", err)
}

// TestRecoveryKilledMidCapture reproduces issue 34's item 1 for recovery: a
// recovery pass, in a process of its own, claims a charge whose first
// attempt died, looks it up, sends the capture and is SIGKILLed before the
// answer. Its history entries were written when a pass ended, so the
// killed pass left no mark at all. The timeline now says when recovery
// claimed it and that its capture was sent with no answer stored; the
// stuck list names that cause.
func TestRecoveryKilledMidCapture(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"postgres", "sqlite"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			var (
				store chargeonce.Store
				where string
			)
			if kind == "postgres" {
				where = pgtest.URL(t)
				store = apitest.PostgresStoreAt(t, where)
			} else {
				where = filepath.Join(t.TempDir(), "chargeonce.db")
				s, err := sqlite.Open(t.Context(), where)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				if err := s.Migrate(t.Context()); err != nil {
					t.Fatal(err)
				}
				store = s
			}
			// A first attempt that committed its record and died: its
			// lease ends at once, so recovery claims it.
			rec, _, err := store.KeyInsert(t.Context(), chargeonce.KeyInsertParams{
				Fingerprint: "fp_k", Token: "tok_first", Lease: time.Millisecond,
				Charge: chargeonce.Charge{ID: "ch_killedrecovery" + kind, MerchantID: "demo", IdempotencyKey: "k-1", OrderID: 7, AmountCents: 1000, Currency: "JPY", PaymentToken: "tok_ok"},
			})
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(10 * time.Millisecond)

			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestRecoveryPassProcess$", "-test.count=1")
			cmd.Env = append(os.Environ(), childKindEnv+"="+kind, childStoreEnv+"="+where)
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			var stderr strings.Builder
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			sent := make(chan string, 1)
			go func() {
				sc := bufio.NewScanner(out)
				for sc.Scan() {
					if ref, ok := strings.CutPrefix(sc.Text(), "capture-sent "); ok {
						sent <- ref
					}
				}
				close(sent)
			}()
			select {
			case ref, ok := <-sent:
				if !ok || ref != rec.Charge.Reference() {
					_ = cmd.Process.Kill()
					_ = cmd.Wait()
					t.Fatalf("the recovery process sent %q, want %s's capture; stderr:\n%s", ref, rec.Charge.ID, stderr.String())
				}
			case <-time.After(60 * time.Second):
				_ = cmd.Process.Kill()
				t.Fatalf("the recovery process never sent the capture; stderr:\n%s", stderr.String())
			}
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait()

			srv, err := admin.New(admin.Config{Store: store, Acquirer: apitest.Simulator(t, acquirer.Options{}), Keys: adminKeys(t)})
			if err != nil {
				t.Fatal(err)
			}
			ts := httptest.NewServer(srv)
			t.Cleanup(ts.Close)
			e := &env{store: store, admin: ts}
			history := func() []admin.EntryJSON {
				_, b := e.call(t, "GET", "/admin/v1/charges/"+rec.Charge.ID, aliceKey, nil)
				var d admin.ChargeDetailJSON
				if err := json.Unmarshal(b, &d); err != nil {
					t.Fatalf("%v: %s", err, b)
				}
				return d.History
			}
			// Once the killed pass's lease has ended, nobody drives it:
			// the capture it sent has no answer stored.
			time.Sleep(childLease)
			h := history()
			var claimedAt time.Time
			found := false
			for i, en := range h {
				if en.Kind == chargeonce.HistoryRecoveryClaim && en.Actor == engine.ActorRecovery {
					claimedAt = en.At
				}
				if en.Kind == chargeonce.HistoryCapture && en.Actor == engine.ActorRecovery && en.Outcome == admin.CaptureSentNoAnswer && i > 0 && !claimedAt.IsZero() {
					found = !en.At.Before(claimedAt)
				}
			}
			if !found {
				t.Fatalf("history of a charge whose recovery pass was killed mid-capture: %s; want recovery's claim, then its capture sent with no answer stored", describe(h))
			}
			page, err := store.(chargeonce.OperatorStore).ChargesListStuck(t.Context(), chargeonce.StuckListParams{Limit: 10})
			if err != nil || len(page.Charges) != 1 {
				t.Fatalf("stuck list: %+v %v", page, err)
			}
			if g := admin.Groups(page.Charges); len(g) != 1 || g[0].Cause != "capture sent, no answer stored" {
				t.Errorf("groups: %+v", g)
			}
		})
	}
}

// describe lists a timeline's entries, a line each.
func describe(h []admin.EntryJSON) string {
	var b strings.Builder
	for _, e := range h {
		fmt.Fprintf(&b, "\n  %s %s by %s: %s", e.At.Format("15:04:05.000"), e.Kind, e.Actor, e.Outcome)
	}
	return b.String()
}
