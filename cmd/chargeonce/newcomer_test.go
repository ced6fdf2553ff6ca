package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A resolve without --reason (or --status) is a command line chargeonce
// cannot run: exit 2 before the admin API is called, as every usage error,
// where the admin API's 400 made it exit 1.
func TestResolveWithoutReasonOrStatusIsAUsageError(t *testing.T) {
	t.Parallel()
	keyFile := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(keyFile, []byte("ak_test_demo\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"resolve", "ch_01a2", "--status", "captured"},
		{"resolve", "ch_01a2", "--status", "captured", "--reason", "  "},
		{"resolve", "re_01a2", "--reason", "ticket 52"},
	} {
		args = append(args, "--admin-key-file", keyFile, "--admin-url", "http://127.0.0.1:1", "--timeout", "2s")
		_, errOut, err := runMain(t, args...)
		if !errors.As(err, new(usageError)) {
			t.Errorf("chargeonce %s: %v (%q); want a usage error (exit 2)", strings.Join(args, " "), err, errOut)
		}
	}
}

// The summaries of the commands that act on refunds, captures and cancels
// too say so: `chargeonce help` said "charge" only for resolve, publish
// and worker.
func TestCommandSummariesNameEveryKind(t *testing.T) {
	t.Parallel()
	for _, c := range commands() {
		switch c.name {
		case "resolve", "publish", "worker":
			for _, kind := range []string{"refund", "capture", "cancel"} {
				if !strings.Contains(c.summary, kind) {
					t.Errorf("%s's summary %q does not say it handles a %s", c.name, c.summary, kind)
				}
			}
		}
	}
}
