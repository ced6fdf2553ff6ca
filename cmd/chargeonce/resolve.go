package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
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

// runResolve settles a stuck charge, refund (re_…), capture (cp_…) or
// cancel (vd_…) as an operator decided, through the admin API route of its
// kind (SPEC "Operators"): it prints what was resolved and the audit entry.
// Exit status 1 when the API refuses (it is no longer processing, or the
// acquirer disagrees: its answer is printed).
func runResolve(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		adminURL, keyFile, status, declineCode, failureReason, reason string
		force                                                         bool
		timeout                                                       time.Duration
	)
	fs := newFlagSet("resolve", stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: chargeonce resolve ID --status STATUS --reason \"…\" [flags]\n\n")
		fmt.Fprintf(stderr, "ID is what is stuck, and says which outcomes --status takes:\n")
		fmt.Fprintf(stderr, "  ch_…        a charge:          captured | declined  (--decline-code)\n")
		fmt.Fprintf(stderr, "              (capture_method manual: authorized | declined)\n")
		fmt.Fprintf(stderr, "  re_…        a refund:          succeeded | failed | canceled  (--failure-reason)\n")
		fmt.Fprintf(stderr, "  cp_… vd_…   a capture or void: succeeded | failed  (--failure-reason)\n\n")
		printFlags(stderr, fs)
		fmt.Fprintf(stderr, "\nThe admin key comes from --admin-key-file or %s.\n", adminKeyEnv)
	}
	fs.StringVar(&adminURL, "admin-url", DefaultAdminURL, "the admin API: serve's --admin-addr")
	fs.StringVar(&keyFile, "admin-key-file", "", "a file holding your admin key (default: the "+adminKeyEnv+" environment variable)")
	fs.StringVar(&status, "status", "", "the outcome the acquirer confirmed: captured or declined (a charge), authorized or declined (a charge with capture_method manual); succeeded, failed or canceled (a refund); succeeded or failed (a capture or void)")
	fs.StringVar(&declineCode, "decline-code", "", "a charge's decline code, for declined (default: the acquirer's, else "+admin.DefaultDeclineCode+")")
	fs.StringVar(&failureReason, "failure-reason", "", "a refund's, capture's or void's failure reason, for failed or canceled (default: the acquirer's, else "+admin.DefaultRefundFailure+")")
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
		return usageError("resolve needs the id of what is stuck: chargeonce resolve CH_ID --status captured --reason \"…\" (or a refund's re_…, a capture's cp_…, a void's vd_…)")
	}
	// Both are the operator's to give: a command line without them is
	// a usage error (exit 2), found before the admin API is called.
	if strings.TrimSpace(status) == "" {
		return usageError("resolve needs --status: what the acquirer says happened (chargeonce resolve -h lists each kind's)")
	}
	if strings.TrimSpace(reason) == "" {
		return usageError("resolve needs --reason \"…\": say why (who at the acquirer confirmed what); it is kept in the audit trail")
	}
	body, err := resolveBody(id, status, declineCode, failureReason, reason, force)
	if err != nil {
		return err
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
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	u := strings.TrimRight(adminURL, "/") + admin.ResolvePath(id)
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

// resolveBody is the admin API's request body for resolving id, by its
// kind: a charge's takes a decline code, the others a failure reason.
func resolveBody(id, status, declineCode, failureReason, reason string, force bool) ([]byte, error) {
	var q any
	switch kind := admin.KindOf(id); kind {
	case chargeonce.KindCharge:
		if failureReason != "" {
			return nil, usageError("--failure-reason is for a refund, a capture or a void; a charge (" + id + ") takes --decline-code")
		}
		q = admin.ResolveRequest{Status: chargeonce.Status(status), DeclineCode: declineCode, Reason: reason, Force: force}
	default:
		if declineCode != "" {
			return nil, usageError("--decline-code is for a charge; a " + admin.KindName(kind) + " (" + id + ") takes --failure-reason")
		}
		if kind == chargeonce.KindRefund {
			q = admin.RefundResolveRequest{Status: chargeonce.RefundStatus(status), FailureReason: failureReason, Reason: reason, Force: force}
		} else {
			q = admin.OperationResolveRequest{Status: chargeonce.OperationStatus(status), FailureReason: failureReason, Reason: reason, Force: force}
		}
	}
	return json.Marshal(q)
}
