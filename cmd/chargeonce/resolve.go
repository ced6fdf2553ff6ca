package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/admin"
)

// DefaultAdminURL is where `resolve` finds the admin API: serve's
// --admin-addr as the docs start it.
const DefaultAdminURL = "http://127.0.0.1:8081"

// adminKeyEnv holds the admin key for `resolve` when no --admin-key-file is
// given: a secret is never a flag value (ps would show it).
const adminKeyEnv = "CHARGEONCE_ADMIN_KEY"

// runResolve settles a stuck charge as an operator decided, through the
// admin API (SPEC "Operators"): it prints the resolved charge and the audit
// entry. Exit status 1 when the API refuses (the charge is no longer
// processing, or the acquirer disagrees: its answer is printed).
func runResolve(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		adminURL, keyFile, status, declineCode, reason string
		force                                          bool
		timeout                                        time.Duration
	)
	fs := newFlagSet("resolve", stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: chargeonce resolve CH_ID --status captured|declined --reason \"…\" [flags]\n\n")
		printFlags(stderr, fs)
		fmt.Fprintf(stderr, "\nThe admin key comes from --admin-key-file or %s.\n", adminKeyEnv)
	}
	fs.StringVar(&adminURL, "admin-url", DefaultAdminURL, "the admin API: serve's --admin-addr")
	fs.StringVar(&keyFile, "admin-key-file", "", "a file holding your admin key (default: the "+adminKeyEnv+" environment variable)")
	fs.StringVar(&status, "status", "", "the outcome the acquirer confirmed: captured or declined")
	fs.StringVar(&declineCode, "decline-code", "", "the decline code, for declined (default: the acquirer's, else "+admin.DefaultDeclineCode+")")
	fs.StringVar(&reason, "reason", "", "why: who at the acquirer confirmed what (required; kept in the audit trail)")
	fs.BoolVar(&force, "force", false, "settle even when the acquirer's lookup contradicts --status")
	fs.DurationVar(&timeout, "timeout", 30*time.Second, "how long to wait for the admin API")
	var id string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		id, args = args[0], args[1:]
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if id == "" {
		fs.Usage()
		return usageError("resolve needs the charge id: chargeonce resolve CH_ID --status captured --reason \"…\"")
	}
	key := strings.TrimSpace(os.Getenv(adminKeyEnv))
	if keyFile != "" {
		b, err := os.ReadFile(keyFile) //nolint:gosec // G304: the operator names the key file
		if err != nil {
			return fmt.Errorf("--admin-key-file: %w", err)
		}
		key = strings.TrimSpace(string(b))
	}
	if key == "" {
		return usageError("resolve needs an admin key: --admin-key-file FILE or " + adminKeyEnv)
	}
	body, err := json.Marshal(admin.ResolveRequest{Status: chargeonce.Status(status), DeclineCode: declineCode, Reason: reason, Force: force})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	u := strings.TrimRight(adminURL, "/") + "/admin/v1/charges/" + url.PathEscape(id) + "/resolve"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body)) //nolint:gosec // G704: the operator names the admin API (--admin-url)
	if err != nil {
		return fmt.Errorf("--admin-url: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req) //nolint:gosec // G704: as above
	if err != nil {
		return fmt.Errorf("calling the admin API at %s: %w", adminURL, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("reading the admin API's answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		var p chargeonce.Problem
		if json.Unmarshal(out, &p) == nil && p.Detail != "" {
			fmt.Fprintf(stderr, "%d %s: %s\n", resp.StatusCode, p.Title, p.Detail)
		} else {
			fmt.Fprintf(stderr, "%s\n%s\n", resp.Status, out)
		}
		return exitCodeError(1)
	}
	var pretty bytes.Buffer
	if json.Indent(&pretty, out, "", "  ") == nil {
		out = pretty.Bytes()
	}
	_, err = stdout.Write(out)
	return err
}
