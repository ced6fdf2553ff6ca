package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/acquirer/stripe"
)

// TestStripeFlags: --acquirer stripe takes its key from STRIPE_SECRET_KEY or
// --stripe-key-file, refuses the key itself as the flag's value, and never
// repeats a key in its errors.
func TestStripeFlags(t *testing.T) {
	t.Parallel()
	const secret = "sk_test_0123456789secret"
	file := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(file, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := func(v string) func(string) string {
		return func(name string) string {
			if name == StripeKeyEnv {
				return v
			}
			return ""
		}
	}
	base := acquirerFlags{target: "stripe", timeout: time.Second, stripeSearchLag: stripe.DefaultSearchLag, stripeKeyWindow: stripe.DefaultKeyWindow}
	for _, tc := range []struct {
		name    string
		keyFile string
		env     string
		wantErr string
	}{
		{name: "env", env: secret},
		{name: "file", keyFile: file},
		{name: "none", wantErr: StripeKeyEnv},
		{name: "key as flag value", keyFile: secret, wantErr: "not the key"},
		{name: "missing file", keyFile: filepath.Join(t.TempDir(), "nope"), wantErr: "--stripe-key-file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a := base
			a.stripeKeyFile, a.getenv = tc.keyFile, env(tc.env)
			acq, _, err := a.build()
			if tc.wantErr == "" {
				if _, ok := acq.(*stripe.Acquirer); err != nil || !ok {
					t.Fatalf("build = %T, %v; want a Stripe acquirer", acq, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("build error = %v; want one naming %q", err, tc.wantErr)
			}
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("the error repeats the key: %v", err)
			}
		})
	}
}
