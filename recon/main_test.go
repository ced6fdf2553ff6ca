package recon_test

import (
	"testing"

	"github.com/chargeonce/chargeonce/internal/pgtest"
)

func TestMain(m *testing.M) {
	pgtest.VerifyMain(m)
}
