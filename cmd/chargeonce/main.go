// Command chargeonce is the charge-once service and its tools:
//
//	chargeonce serve      the HTTP API, with recovery and the key sweeper inside
//	chargeonce acquirer   the stand-alone acquirer simulator
//	chargeonce migrate    applies the schema to --db
//	chargeonce reconcile  one recovery pass, then exits
//	chargeonce recon      reconciles a day of charges with the acquirer's ledger
//	chargeonce charge     charges through the retrying Go client
//	chargeonce race       the naive designs double-charging, and ours not
//	chargeonce worker     consumes charge, refund, capture and cancel requests from NATS JetStream
//	chargeonce publish    sends one such request to the queue, prints its result
//	chargeonce resolve    settles a stuck charge, refund, capture or cancel as an operator decided (admin API)
//	chargeonce admin-key  makes a new admin key and its --admin-keys-file line
//	chargeonce version    prints the version (also --version, -v)
//
// Every flag has an environment twin: --key-ttl is CHARGEONCE_KEY_TTL.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// command is one sub-command.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"serve", "run the HTTP API (with recovery and the key sweeper)", runServe},
		{"acquirer", "run the stand-alone acquirer simulator", runAcquirer},
		{"migrate", "apply the schema to --db", runMigrate},
		{"reconcile", "run one recovery pass, then exit", runReconcile},
		{"recon", "reconcile a day of charges with the acquirer's ledger; store the run, print the report", runRecon},
		{"bench", "measure chargeonce against a bare handler and raw SQL on the same statements", runBench},
		{"charge", "charge once through the API, retrying safely, and print the charge", runCharge},
		{"race", "run the double-charge experiment: naive designs against insert-first", runRace},
		{"worker", "consume charge, refund, capture and cancel requests from NATS JetStream (with recovery and the outbox publisher)", runWorker},
		{"publish", "send one charge, refund, capture or cancel request to the queue and print its result", runPublish},
		{"resolve", "settle a stuck charge, refund, capture or cancel (void) as an operator decided, through the admin API", runResolve},
		{"admin-key", "make a new admin key and its line for --admin-keys-file (admin-key new --name NAME)", runAdminKey},
		{"version", "print the version, the commit and the schema version of each store", runVersion},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	var ec exitCodeError
	switch {
	case err == nil:
	case errors.As(err, &ec):
		os.Exit(int(ec))
	case errors.As(err, new(usageError)):
		fmt.Fprintln(os.Stderr, errorLine(err))
		os.Exit(2)
	case errors.Is(err, flag.ErrHelp):
		// Help was asked for and printed. Exit 0, not flag's usual 2:
		// `charge` exits 2 for a declined card.
		os.Exit(0)
	default:
		fmt.Fprintln(os.Stderr, errorLine(err))
		os.Exit(1)
	}
}

// errorLine is the line a failed command ends with: its error after one
// "chargeonce: " prefix. The client's and the library's errors carry that
// prefix already, as a package's errors do.
func errorLine(err error) string {
	return "chargeonce: " + strings.TrimPrefix(err.Error(), "chargeonce: ")
}

// exitCodeError is an error that only carries a process exit status; the
// command has already said what it had to.
type exitCodeError int

func (e exitCodeError) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// usageError is a command line chargeonce cannot run: exit status 2.
type usageError string

func (e usageError) Error() string { return string(e) }

// Main runs the sub-command named by args[0].
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		// No command is a usage error: say what there is, exit 2.
		usage(stderr)
		return exitCodeError(2)
	}
	if args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(stdout)
		return nil
	}
	if args[0] == "-v" || args[0] == "-version" || args[0] == "--version" {
		return runVersion(ctx, args[1:], stdout, stderr)
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return c.run(ctx, args[1:], stdout, stderr)
		}
	}
	return usageError(fmt.Sprintf("unknown command %q\nRun 'chargeonce help' for the commands.", args[0]))
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: chargeonce <command> [flags]")
	fmt.Fprintln(w)
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run 'chargeonce <command> -h' for its flags. Every flag has a CHARGEONCE_* environment twin.")
	fmt.Fprintln(w, "'chargeonce --version' (or -v) is 'chargeonce version'.")
}
