package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/client"
)

// Defaults of `chargeonce charge`.
const (
	DefaultURL           = "http://127.0.0.1:8080"
	DefaultAPIKey        = "sk_test_demo"
	DefaultToken         = "tok_ok"
	DefaultCurrency      = "BRL"
	DefaultChargeTimeout = client.DefaultRetryFor
)

// intentFlags describe the one payment intent that `charge` (over HTTP) and
// `publish` (over the queue) send: the same fields, defaults and checks.
type intentFlags struct {
	order, amount               int64
	token, key, currency, descr string
	timeout                     time.Duration
}

func (f *intentFlags) register(fs *flag.FlagSet, keyHelp, timeoutHelp string) {
	fs.Int64Var(&f.order, "order", 0, "order id (required, positive)")
	fs.Int64Var(&f.amount, "amount", 0, "amount in the currency's minor unit per ISO 4217: cents for USD, whole yen for JPY, fils for KWD (required, positive)")
	fs.StringVar(&f.token, "token", DefaultToken, "payment token (test tokens: tok_ok, tok_declined, tok_slow, tok_fail_before, tok_fail_after)")
	fs.StringVar(&f.key, "key", "", keyHelp)
	fs.StringVar(&f.currency, "currency", DefaultCurrency, "ISO 4217 currency code")
	fs.StringVar(&f.descr, "description", "", "optional description, at most 500 characters")
	fs.DurationVar(&f.timeout, "timeout", DefaultChargeTimeout, timeoutHelp)
}

// check refuses what no intent can be, naming the flag. The rest (currency,
// token, description) is for the service to judge, as it judges any client.
func (f *intentFlags) check() error {
	switch {
	case f.order <= 0:
		return fmt.Errorf("--order is required and must be positive")
	case f.amount <= 0:
		return fmt.Errorf("--amount is required and must be positive")
	case f.timeout <= 0:
		return fmt.Errorf("--timeout must be positive; got %s", f.timeout)
	}
	return nil
}

// chargeConfig is everything `charge` is configured with.
type chargeConfig struct {
	intentFlags
	url, apiKey    string
	attemptTimeout time.Duration
	maxAttempts    int
}

// runCharge charges once through the client package and prints the final
// charge as JSON on stdout and every attempt on stderr. Exit status: 0
// captured, 2 declined, 1 anything else (including an unknown outcome).
func runCharge(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var c chargeConfig
	fs := newFlagSet("charge", stderr)
	fs.StringVar(&c.url, "url", DefaultURL, "base URL of the chargeonce API")
	fs.StringVar(&c.apiKey, "api-key", DefaultAPIKey, "the merchant's API key")
	c.register(fs, "idempotency key of this payment intent (default: a new random UUIDv4, printed on stderr); run again with the same key to learn the outcome of an earlier run",
		"how long to keep trying, all attempts included")
	fs.DurationVar(&c.attemptTimeout, "attempt-timeout", client.DefaultAttemptTimeout, "how long one attempt may take before it is retried")
	fs.IntVar(&c.maxAttempts, "max-attempts", client.DefaultMaxAttempts, "the most attempts to make (0: no bound; --timeout bounds the call)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := c.check(); err != nil {
		return err
	}
	switch {
	case c.attemptTimeout <= 0:
		return fmt.Errorf("--attempt-timeout must be positive; got %s", c.attemptTimeout)
	case c.maxAttempts < 0:
		return fmt.Errorf("--max-attempts must not be negative; got %d", c.maxAttempts)
	}

	// The key is made here rather than inside the client so that it is on
	// the terminal before the first attempt: if this run dies or gives up,
	// the same key is the only safe way to ask what happened.
	// --key has no environment twin (see noEnvTwin): a key left exported
	// would make every later run the same intent.
	if c.key == "" {
		c.key = client.NewIdempotencyKey()
	}
	fmt.Fprintf(stderr, "charging order %d, %s, at %s with Idempotency-Key %s\n", c.order, chargeonce.FormatAmount(c.amount, c.currency), c.url, c.key)

	cl := client.New(c.url, c.apiKey,
		client.WithAttemptTimeout(c.attemptTimeout),
		client.WithMaxAttempts(c.maxAttempts),
		client.WithAttemptHook(func(a client.Attempt) {
			if a.Key != "" { // the charge's attempts, not the read-back of a decline
				printAttempt(stderr, a)
			}
		}),
	)
	defer cl.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()

	ch, err := cl.CreateCharge(ctx, client.ChargeRequest{
		OrderID:        c.order,
		AmountCents:    c.amount,
		Currency:       c.currency,
		PaymentToken:   c.token,
		Description:    c.descr,
		IdempotencyKey: c.key,
	})
	var (
		declined *client.DeclinedError
		gaveUp   *client.GaveUpError
		pending  *client.ProcessingError
	)
	switch {
	case err == nil:
		if ch.Replayed {
			fmt.Fprintf(stderr, "captured %s after %s: replayed — an earlier attempt or run made this charge; no money moved again\n", ch.ID, plural(ch.Attempts, "attempt"))
		} else {
			fmt.Fprintf(stderr, "captured %s after %s\n", ch.ID, plural(ch.Attempts, "attempt"))
		}
		return printJSON(stdout, ch)

	case errors.As(err, &declined):
		fmt.Fprintf(stderr, "declined: charge %s, decline code %s, after %s\n", declined.ChargeID, declined.DeclineCode, plural(declined.Attempts(), "attempt"))
		// Print the declined charge itself; the problem details are the
		// fallback when it cannot be read.
		var out any = declined.Problem
		if got, gerr := cl.GetCharge(ctx, declined.ChargeID); gerr == nil {
			out = got
		} else {
			fmt.Fprintf(stderr, "reading charge %s: %v\n", declined.ChargeID, gerr)
		}
		if perr := printJSON(stdout, out); perr != nil {
			return perr
		}
		return exitCodeError(2)

	case errors.As(err, &gaveUp):
		if errors.As(err, &pending) {
			// The charge exists and is processing; show it.
			if perr := printJSON(stdout, pending.Charge); perr != nil {
				return perr
			}
		}
		fmt.Fprintf(stderr, "the outcome is unknown: run again with --key %s to learn it (the same key can never charge twice)\n", c.key)
		return err

	default:
		return err
	}
}

// printAttempt writes one line per attempt.
func printAttempt(w io.Writer, a client.Attempt) {
	var what string
	switch {
	case a.Err != nil:
		what = a.Err.Error()
	case a.Replayed:
		what = fmt.Sprintf("%d %s (replayed)", a.Status, http.StatusText(a.Status))
	default:
		what = fmt.Sprintf("%d %s", a.Status, http.StatusText(a.Status))
	}
	line := fmt.Sprintf("attempt %d: %s after %s", a.N, what, a.Duration.Round(time.Millisecond))
	if a.Wait > 0 {
		line += fmt.Sprintf("; retrying in %s", a.Wait.Round(time.Millisecond))
	}
	fmt.Fprintln(w, line)
}

func printJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding the charge: %w", err)
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

func plural(n int, word string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, word)
	}
	return fmt.Sprintf("%d %ss", n, word)
}
