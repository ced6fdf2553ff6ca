package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/chargeonce/chargeonce"
)

// The statements release v0.3.0 (docs/releases) completes records with,
// copied from its postgres/store.go and postgres/batch_sql.go: first
// attempts, retries and recovery alike. They write no event. During a
// rolling upgrade its instances settle charges beside this release's, on
// this release's schema.
const (
	v030KeyCompleteSQL = `
WITH k AS (
	UPDATE idempotency_keys
	SET state = 'completed', response_status = $4, response_body = $5, updated_at = now(),
		expires_at = now() + $8::interval
	WHERE merchant_id = $1 AND key = $2 AND token = $3 AND state = 'processing'
	RETURNING charge_id
), c AS (
	UPDATE charges
	SET status = $6, decline_code = NULLIF($7, ''), updated_at = now()
	FROM k WHERE charges.id = k.charge_id
)
SELECT count(*) FROM k`

	v030KeyCompleteBatchSQL = `
WITH input AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::integer[], $5::bytea[], $6::text[], $7::text[], $8::bigint[])
		AS t(merchant_id, key, token, response_status, response_body, charge_status, decline_code, ttl_us)
), k AS (
	UPDATE idempotency_keys i
	SET state = 'completed', response_status = input.response_status, response_body = input.response_body,
		updated_at = now(), expires_at = now() + input.ttl_us * interval '1 microsecond'
	FROM input
	WHERE i.merchant_id = input.merchant_id AND i.key = input.key AND i.token = input.token AND i.state = 'processing'
	RETURNING i.merchant_id, i.key, i.charge_id, input.charge_status, input.decline_code
), c AS (
	UPDATE charges
	SET status = k.charge_status, decline_code = NULLIF(k.decline_code, ''), updated_at = now()
	FROM k WHERE charges.id = k.charge_id
)
SELECT merchant_id, key FROM k`
)

// TestEventForSettlementsByThePreviousRelease settles charges with release
// v0.3.0's statements, alone and batched, by a first attempt and by
// recovery, for a merchant without an endpoint and for one with an
// endpoint: each settlement records exactly one event of its outcome, in
// its own transaction, and the merchant with an endpoint gets one delivery
// per event (seen failing during a rolling upgrade: every settlement the
// previous release made produced no event, ever).
func TestEventForSettlementsByThePreviousRelease(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := t.Context()
	ep, err := s.WebhookEndpointCreate(ctx, chargeonce.WebhookEndpoint{
		ID: "we_hooked", MerchantID: "m-hooked", URL: "https://example.com/hook", Secret: "whsec_x"})
	if err != nil {
		t.Fatalf("WebhookEndpointCreate: %v", err)
	}
	n := 0
	insert := func(merchant string, lease time.Duration) chargeonce.KeyInsertParams {
		t.Helper()
		n++
		p := chargeonce.KeyInsertParams{
			Fingerprint: "fp", Token: fmt.Sprintf("tok_%d", n), Lease: lease,
			Charge: chargeonce.Charge{ID: fmt.Sprintf("ch_%s_%d", merchant, n), MerchantID: merchant,
				IdempotencyKey: fmt.Sprintf("k%d", n), OrderID: int64(n), AmountCents: 100, Currency: "BRL", PaymentToken: "tok_ok"},
		}
		if _, inserted, err := s.KeyInsert(ctx, p); err != nil || !inserted {
			t.Fatalf("KeyInsert: %v, inserted=%v", err, inserted)
		}
		return p
	}
	// complete runs v0.3.0's single statement, on q (the pool or a
	// transaction), and returns how many records it completed.
	complete := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}, p chargeonce.KeyInsertParams, token string, status chargeonce.Status) int {
		t.Helper()
		code, resp := "", 201
		if status == chargeonce.StatusDeclined {
			code, resp = "card_declined", 402
		}
		var got int
		if err := q.QueryRow(ctx, v030KeyCompleteSQL, p.Charge.MerchantID, p.Charge.IdempotencyKey, token,
			resp, []byte(`{}`), string(status), code, time.Hour).Scan(&got); err != nil {
			t.Fatalf("v0.3.0's keyCompleteSQL: %v", err)
		}
		return got
	}
	want := map[string]map[string]string{} // merchant → charge id → event type
	for _, m := range []string{"m-none", "m-hooked"} {
		want[m] = map[string]string{}

		// A first attempt's completion, captured and declined.
		for _, st := range []chargeonce.Status{chargeonce.StatusCaptured, chargeonce.StatusDeclined} {
			p := insert(m, time.Hour)
			if got := complete(s.Pool(), p, p.Token, st); got != 1 {
				t.Fatalf("v0.3.0's completion of %s completed %d records", p.Charge.ID, got)
			}
			want[m][p.Charge.ID] = "charge." + string(st)
			// Its retry finds the record completed: no second event.
			if got := complete(s.Pool(), p, p.Token, st); got != 0 {
				t.Fatalf("v0.3.0's second completion of %s completed %d records", p.Charge.ID, got)
			}
		}

		// A settlement whose transaction rolls back records nothing.
		p := insert(m, 0) // orphaned at once: recovery settles it below
		err := pgx.BeginFunc(ctx, s.Pool(), func(tx pgx.Tx) error {
			if got := complete(tx, p, p.Token, chargeonce.StatusCaptured); got != 1 {
				t.Fatalf("v0.3.0's completion in a transaction completed %d records", got)
			}
			return fmt.Errorf("rolled back on purpose")
		})
		if err == nil {
			t.Fatal("the transaction committed")
		}
		// Recovery: the orphaned record claimed, then completed under
		// the claim's token.
		recs, err := s.KeysClaimExpired(ctx, time.Hour, 10)
		if err != nil || len(recs) != 1 || recs[0].Charge.ID != p.Charge.ID {
			t.Fatalf("KeysClaimExpired = %+v, %v; want %s", recs, err, p.Charge.ID)
		}
		if got := complete(s.Pool(), p, recs[0].Token, chargeonce.StatusCaptured); got != 1 {
			t.Fatalf("v0.3.0's recovery completed %d records", got)
		}
		want[m][p.Charge.ID] = chargeonce.EventChargeCaptured

		// A batch of completions.
		var merchants, keys, tokens, statuses, declines []string
		var codes []int32
		var bodies [][]byte
		var ttls []int64
		for i := range 3 {
			p := insert(m, time.Hour)
			st, code, resp := chargeonce.StatusCaptured, "", int32(201)
			if i == 1 {
				st, code, resp = chargeonce.StatusDeclined, "card_declined", 402
			}
			merchants, keys, tokens = append(merchants, m), append(keys, p.Charge.IdempotencyKey), append(tokens, p.Token)
			codes, bodies, statuses, declines = append(codes, resp), append(bodies, []byte(`{}`)), append(statuses, string(st)), append(declines, code)
			ttls = append(ttls, time.Hour.Microseconds())
			want[m][p.Charge.ID] = "charge." + string(st)
		}
		rows, err := s.Pool().Query(ctx, v030KeyCompleteBatchSQL, merchants, keys, tokens, codes, bodies, statuses, declines, ttls)
		if err != nil {
			t.Fatalf("v0.3.0's keyCompleteBatchSQL: %v", err)
		}
		done, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
			var merchant, key string
			err := r.Scan(&merchant, &key)
			return key, err
		})
		if err != nil || len(done) != 3 {
			t.Fatalf("v0.3.0's keyCompleteBatchSQL completed %v, %v; want 3 records", done, err)
		}
	}

	for m, charges := range want {
		page, err := s.WebhookEventsList(ctx, chargeonce.EventsListParams{MerchantID: m, Limit: chargeonce.EventsListMaxLimit})
		if err != nil {
			t.Fatalf("WebhookEventsList: %v", err)
		}
		got := map[string]string{}
		for _, ev := range page.Events {
			if _, dup := got[ev.ChargeID]; dup {
				t.Fatalf("%s: two events for %s", m, ev.ChargeID)
			}
			got[ev.ChargeID] = ev.Type
			if ev.ID != "evt_"+ev.ChargeID[3:] || ev.MerchantID != m {
				t.Fatalf("%s: event %+v", m, ev)
			}
		}
		if len(got) != len(charges) {
			t.Errorf("%s: %d events for %d charges settled by v0.3.0's statements: %v; want %v", m, len(got), len(charges), got, charges)
		}
		for id, typ := range charges {
			if got[id] != typ {
				t.Errorf("%s: charge %s has event %q, want %q", m, id, got[id], typ)
			}
		}
	}
	ds, err := s.WebhookDeliveriesClaim(ctx, time.Hour, 100, 100, nil)
	if err != nil {
		t.Fatalf("WebhookDeliveriesClaim: %v", err)
	}
	per := map[string]int{}
	for _, d := range ds {
		if d.Endpoint.ID != ep.ID {
			t.Fatalf("a delivery to %s", d.Endpoint.ID)
		}
		per[d.Event.ChargeID]++
	}
	for id := range want["m-hooked"] {
		if per[id] != 1 {
			t.Errorf("charge %s: %d deliveries to the enabled endpoint, want 1", id, per[id])
		}
	}
	if len(ds) != len(want["m-hooked"]) {
		t.Errorf("%d deliveries, want %d (one per event of the merchant with an endpoint)", len(ds), len(want["m-hooked"]))
	}
}
