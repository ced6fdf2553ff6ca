package chargeonce_test

import (
	"math"
	"testing"

	"github.com/chargeonce/chargeonce"
)

// TestFormatAmount: amounts are shown in the currency's ISO 4217 minor
// unit with thousands separators (issue 34: ¥1,000 was shown "10.00 JPY",
// 1,000 fils "10.00 KWD").
func TestFormatAmount(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		minor    int64
		currency string
		want     string
	}{
		{1000, "JPY", "1,000 JPY"},
		{1000, "KWD", "1.000 KWD"},
		{1000, "USD", "10.00 USD"},
		{2500, "brl", "25.00 BRL"},
		{123456789, "USD", "1,234,567.89 USD"},
		{123456789, "JPY", "123,456,789 JPY"},
		{1234567, "KWD", "1,234.567 KWD"},
		{5, "USD", "0.05 USD"},
		{5, "KWD", "0.005 KWD"},
		{0, "JPY", "0 JPY"},
		{-150000, "EUR", "-1,500.00 EUR"},
		{999, "CLF", "0.0999 CLF"},
		{math.MinInt64, "USD", "-92,233,720,368,547,758.08 USD"},
	} {
		if got := chargeonce.FormatAmount(tc.minor, tc.currency); got != tc.want {
			t.Errorf("FormatAmount(%d, %s) = %q; want %q", tc.minor, tc.currency, got, tc.want)
		}
	}
	if chargeonce.CurrencyExponent("jpy") != 0 || chargeonce.CurrencyExponent("KWD") != 3 || chargeonce.CurrencyExponent("XYZ") != 2 {
		t.Error("CurrencyExponent")
	}
}
