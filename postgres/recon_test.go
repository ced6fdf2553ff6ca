package postgres_test

import (
	"testing"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/storetest"
)

func TestReconConformance(t *testing.T) {
	t.Parallel()
	storetest.RunRecon(t, func(t *testing.T) chargeonce.Store { return setup(t) })
}
