package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/internal/apitest"
)

var chargeOrderSeq atomic.Int64

func init() { chargeOrderSeq.Store(time.Now().UnixNano() % 1e9 * 1000) }

// chargeCLI runs `chargeonce charge` against baseURL with args appended.
func chargeCLI(t *testing.T, baseURL string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errw bytes.Buffer
	all := append([]string{"charge", "--url", baseURL, "--api-key", apitest.APIKey}, args...)
	err = Main(context.Background(), all, &out, &errw)
	t.Logf("chargeonce %s\nstderr:\n%s", strings.Join(all, " "), errw.String())
	return out.String(), errw.String(), err
}

type cliCharge struct {
	ID          string  `json:"id"`
	OrderID     int64   `json:"order_id"`
	AmountCents int64   `json:"amount_cents"`
	Currency    string  `json:"currency"`
	Status      string  `json:"status"`
	DeclineCode *string `json:"decline_code"`
	CreatedAt   string  `json:"created_at"`
}

func decodeCLICharge(t *testing.T, stdout string) cliCharge {
	t.Helper()
	var c cliCharge
	dec := json.NewDecoder(strings.NewReader(stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("stdout is not a charge object: %v\n%s", err, stdout)
	}
	return c
}

func startChargeAPI(t *testing.T) (*apitest.Instance, *acquirer.Simulator) {
	t.Helper()
	store := apitest.Store(t, "sqlite")
	sim := apitest.Simulator(t, acquirer.Options{})
	return apitest.Start(t, store, sim, engine.Options{}), sim
}

func TestChargeCommandCaptures(t *testing.T) {
	t.Parallel()
	inst, sim := startChargeAPI(t)
	order := chargeOrderSeq.Add(1)
	args := []string{"--order", strconv.FormatInt(order, 10), "--amount", "2500", "--key", "cli-" + strconv.FormatInt(order, 10), "--description", "from the CLI test"}

	stdout, stderr, err := chargeCLI(t, inst.URL, args...)
	if err != nil {
		t.Fatalf("charge: %v", err)
	}
	c := decodeCLICharge(t, stdout)
	if c.Status != "captured" || c.OrderID != order || c.AmountCents != 2500 || c.Currency != "BRL" || c.DeclineCode != nil || !strings.HasPrefix(c.ID, "ch_") {
		t.Fatalf("charge = %+v", c)
	}
	if !strings.Contains(stderr, "attempt 1: 201 Created") || !strings.Contains(stderr, "cli-") {
		t.Fatalf("stderr lacks the attempt or the key:\n%s", stderr)
	}

	// The same command again is the same intent: the stored charge, flagged.
	stdout, stderr, err = chargeCLI(t, inst.URL, args...)
	if err != nil {
		t.Fatalf("second run: %v", err)
	}
	if again := decodeCLICharge(t, stdout); again.ID != c.ID {
		t.Fatalf("second run printed %s, want %s", again.ID, c.ID)
	}
	if !strings.Contains(stderr, "replayed") {
		t.Fatalf("second run does not say it was a replay:\n%s", stderr)
	}
	if n := sim.CapturedCount("demo", order); n != 1 {
		t.Fatalf("captured %d times, want 1", n)
	}
}

func TestChargeCommandDeclinedExits2(t *testing.T) {
	t.Parallel()
	inst, _ := startChargeAPI(t)
	order := chargeOrderSeq.Add(1)
	stdout, stderr, err := chargeCLI(t, inst.URL, "--order", strconv.FormatInt(order, 10), "--amount", "2500", "--token", acquirer.TokenDeclined)
	var ec exitCodeError
	if !errors.As(err, &ec) || ec != 2 {
		t.Fatalf("err = %v, want exitCodeError(2)", err)
	}
	c := decodeCLICharge(t, stdout)
	if c.Status != "declined" || c.DeclineCode == nil || *c.DeclineCode != acquirer.DeclineInsufficientFunds || c.OrderID != order {
		t.Fatalf("declined charge = %+v", c)
	}
	if !strings.Contains(stderr, "attempt 1: 402 Payment Required") || strings.Contains(stderr, "attempt 2") || !strings.Contains(stderr, "declined: charge "+c.ID) {
		t.Fatalf("stderr:\n%s", stderr)
	}
}

func TestChargeCommandFailuresExit1(t *testing.T) {
	t.Parallel()
	// Bad flags name the flag and are not a decline.
	for _, args := range [][]string{
		{"--amount", "100"},
		{"--order", "1"},
		{"--order", "1", "--amount", "100", "--timeout", "0s"},
	} {
		_, _, err := chargeCLI(t, "http://127.0.0.1:1", args...)
		var ec exitCodeError
		if err == nil || errors.As(err, &ec) || !strings.Contains(err.Error(), "--") {
			t.Fatalf("args %v: err = %v, want a flag error", args, err)
		}
	}

	// A service that keeps failing: the attempts are printed, the key to
	// ask again with is given, and the exit status is 1.
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	_, stderr, err := chargeCLI(t, srv.URL, "--order", "1", "--amount", "100", "--key", "k-unknown", "--max-attempts", "2", "--timeout", "5s")
	var ec exitCodeError
	if err == nil || errors.As(err, &ec) {
		t.Fatalf("err = %v, want an error for exit status 1", err)
	}
	if hits.Load() != 2 || !strings.Contains(stderr, "attempt 2: 503") || !strings.Contains(stderr, "--key k-unknown") {
		t.Fatalf("%d requests; stderr:\n%s", hits.Load(), stderr)
	}
}
