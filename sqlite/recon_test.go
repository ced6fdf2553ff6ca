package sqlite_test

import (
	"testing"

	"github.com/chargeonce/chargeonce/storetest"
)

func TestReconConformance(t *testing.T) {
	t.Parallel()
	storetest.RunRecon(t, newStore)
}
