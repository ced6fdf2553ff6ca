package recon_test

import (
	"testing"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/idempotency"
	"github.com/chargeonce/chargeonce/recon"
)

// ledgerCapture puts a captured capture in the acquirer's ledger under
// reference, its metadata naming our id meta.
func (e *env) ledgerCapture(reference, meta string, amount int64) {
	e.sim.LedgerAdd(chargeonce.LedgerEntry{
		Kind: chargeonce.LedgerCapture, Reference: reference, Merchant: "demo", OrderID: orderSeq.Add(1),
		AmountCents: amount, Currency: "BRL", Status: string(chargeonce.StatusCaptured),
		Metadata: map[string]string{chargeonce.LedgerMetaReference: meta},
	})
}

// When the acquirer's object has no reference, or one we do not know, it
// is joined with our charge by the id its metadata carries.
func TestMetadataFallbackJoin(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		inject func(t *testing.T, e *env) (refs []string)
		want   map[recon.Type]int
	}{
		{
			name: "no reference: joined by metadata",
			inject: func(t *testing.T, e *env) []string {
				c := e.record(t, chargeonce.StatusCaptured, 2500, "BRL")
				e.ledgerCapture("", c.ID, 2500)
				return []string{c.ID}
			},
		},
		{
			name: "an unknown reference: joined by metadata",
			inject: func(t *testing.T, e *env) []string {
				c := e.record(t, chargeonce.StatusCaptured, 2500, "BRL")
				e.ledgerCapture("pi_mangled_"+idempotency.NewToken(), c.ID, 2500)
				return []string{c.ID}
			},
		},
		{
			name: "an unknown reference sorting first: joined by metadata",
			inject: func(t *testing.T, e *env) []string {
				c := e.record(t, chargeonce.StatusCaptured, 2500, "BRL")
				e.ledgerCapture("A_"+idempotency.NewToken(), c.ID, 2500)
				return []string{c.ID}
			},
		},
		{
			name: "an unknown reference, joined by metadata, amount differs",
			inject: func(t *testing.T, e *env) []string {
				c := e.record(t, chargeonce.StatusCaptured, 2500, "BRL")
				e.ledgerCapture("pi_mangled_"+idempotency.NewToken(), c.ID, 2400)
				return []string{c.ID}
			},
			want: map[recon.Type]int{recon.AmountMismatch: 1},
		},
		{
			name: "a second capture under another reference: a duplicate",
			inject: func(t *testing.T, e *env) []string {
				ref := e.charge(t, acquirer.TokenOK)
				e.ledgerCapture("pi_broken_build_"+idempotency.NewToken(), ref, 2500)
				return []string{ref}
			},
			want: map[recon.Type]int{recon.DuplicateForIntent: 1},
		},
		{
			name: "metadata naming nothing of ours: missing internal",
			inject: func(t *testing.T, e *env) []string {
				ref := "pi_stranger_" + idempotency.NewToken()
				e.ledgerCapture(ref, idempotency.NewChargeID(), 2500)
				return []string{ref}
			},
			want: map[recon.Type]int{recon.MissingInternal: 1},
		},
	}
	for _, kind := range kinds {
		for _, tc := range cases {
			t.Run(kind+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				e := setup(t, kind, acquirer.Options{})
				e.background(t, 4)
				refs := tc.inject(t, e)
				e.background(t, 4)
				for _, page := range []int{1, 2, 1000} {
					rep := e.run(t, 0, page)
					wantOnly(t, rep, tc.want, refs...)
					wantMatched := 9
					if len(tc.want) > 0 {
						wantMatched = 8
					}
					wantEntries := 9 // 8 and the injected capture
					if tc.want[recon.DuplicateForIntent] > 0 {
						wantEntries = 10
					}
					if rep.Matched != wantMatched || rep.LedgerEntries != wantEntries {
						t.Errorf("page %d: matched %d, ledger entries %d; want %d %d", page, rep.Matched, rep.LedgerEntries, wantMatched, wantEntries)
					}
					for _, m := range rep.Mismatches {
						if m.Type != recon.MissingInternal && m.JoinedBy != "metadata" {
							t.Errorf("page %d: %s joined by %q, want metadata", page, m.Type, m.JoinedBy)
						}
					}
				}
			})
		}
	}
}
