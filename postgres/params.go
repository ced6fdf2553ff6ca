package postgres

import (
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/chargeonce/chargeonce"
)

// States passed as parameters.
//
// A statement that updates rows it names by key or id, and re-checks their
// state (a completion: the record must still be processing; a delivery's
// claim or finish: it must still be pending), compares the state with a
// parameter, not a constant. With a constant, PostgreSQL can prove the
// predicate of the partial indexes on that state (idempotency_keys_lease_until_idx,
// webhook_deliveries_one_pending and _endpoint_due) and, when its estimates
// say few rows have it, walk every row in that state to find the few named:
// a generic plan cached while the tables were small kept doing so as they
// grew. A completion batch beside 50,000 records in flight (an acquirer
// outage) read 4,850 rows a charge, 108 ms a batch
// (TestPlansMadeOnEmptyTablesUseIndexesAsTheyGrow, named statements); a
// delivery claimed and finished beside another merchant's 40,000 pending read
// 20,008 (TestWebhookClaimAndFinishReadTheirDeliveriesByID); unbatched,
// the single completion, a lease's renewal, a claim and a release read
// 47,000-71,000 rows a charge (the same test, named/unbatched). A parameter
// proves nothing, so the primary or unique key finds them. Statements that
// look for rows in the state (recovery's scan, the sender's pick) keep the
// constant and their partial index.
const (
	stateProcessing = string(chargeonce.KeyProcessing)
	statePending    = "pending"
)

// By id, then the owner (byID).
//
// A statement that reads one row by its id and must check that it is the
// merchant's reads it by the id alone and compares the merchant after it
// (in Go, or outside a MATERIALIZED CTE). With "merchant_id = $1 AND id =
// $2", PostgreSQL may pick an index led by merchant_id that holds the id
// further on (charges_merchant_order_status_created_idx,
// refunds_merchant_created, webhook_events_merchant_created): on a small
// table it costs what the primary key costs, so a generic plan cached on a
// new deployment kept it as the table grew, and every read walked the
// merchant's whole history: ChargeGet read 600-1,730 index blocks a charge
// where the primary key reads a few
// (TestPlansMadeOnEmptyTablesUseIndexesAsTheyGrow).
//
// notTheirs reports whether such a read found nothing for merchantID: no
// row, or another merchant's (owner), which is then answered exactly like a
// row that does not exist.
func notTheirs(err error, owner, merchantID string) bool {
	return errors.Is(err, pgx.ErrNoRows) || (err == nil && owner != merchantID)
}
