package postgres

import "github.com/chargeonce/chargeonce"

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
// 20,008 (TestWebhookClaimAndFinishReadTheirDeliveriesByID). A parameter
// proves nothing, so the primary or unique key finds them. Statements that
// look for rows in the state (recovery's scan, the sender's pick) keep the
// constant and their partial index.
const (
	stateProcessing = string(chargeonce.KeyProcessing)
	statePending    = "pending"
)
