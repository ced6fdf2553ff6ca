package chargeonce

import (
	"strconv"
	"strings"
)

// minorExponents are the ISO 4217 minor-unit exponents that are not 2: a
// charge's AmountCents counts units of 10^-exponent of the currency (whole
// yen for JPY, fils for KWD). Every other currency has exponent 2.
var minorExponents = map[string]int{
	// Exponent 0.
	"BIF": 0, "CLP": 0, "DJF": 0, "GNF": 0, "ISK": 0, "JPY": 0, "KMF": 0, "KRW": 0, "PYG": 0,
	"RWF": 0, "UGX": 0, "UYI": 0, "VND": 0, "VUV": 0, "XAF": 0, "XOF": 0, "XPF": 0,
	// Exponent 3.
	"BHD": 3, "IQD": 3, "JOD": 3, "KWD": 3, "LYD": 3, "OMR": 3, "TND": 3,
	// Exponent 4.
	"CLF": 4, "UYW": 4,
}

// CurrencyExponent returns the ISO 4217 minor-unit exponent of currency (a
// three-letter code, any case): 0 for JPY, 3 for KWD, 2 for USD, EUR, BRL
// and any code not listed as otherwise.
func CurrencyExponent(currency string) int {
	if e, ok := minorExponents[strings.ToUpper(currency)]; ok {
		return e
	}
	return 2
}

// FormatAmount shows an amount in minor units as a person reads it, in
// the currency's exponent with thousands separators and its code:
// FormatAmount(1000, "JPY") is "1,000 JPY", FormatAmount(1000, "KWD")
// "1.000 KWD", FormatAmount(123456, "USD") "1,234.56 USD".
func FormatAmount(minor int64, currency string) string {
	exp := CurrencyExponent(currency)
	neg := minor < 0
	digits := strings.TrimPrefix(strconv.FormatInt(minor, 10), "-")
	if len(digits) <= exp {
		digits = strings.Repeat("0", exp-len(digits)+1) + digits
	}
	whole, frac := digits[:len(digits)-exp], digits[len(digits)-exp:]
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	for i, c := range whole {
		if i > 0 && (len(whole)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if exp > 0 {
		b.WriteByte('.')
		b.WriteString(frac)
	}
	if currency != "" {
		b.WriteByte(' ')
		b.WriteString(strings.ToUpper(currency))
	}
	return b.String()
}
