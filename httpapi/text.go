package httpapi

// maxChargeIDLen bounds the ids GET /v1/charges/{id} looks up; ours are 31
// bytes long.
const maxChargeIDLen = 255

// plausibleChargeID reports whether id could name a charge: 1 to
// maxChargeIDLen visible ASCII characters, like every id the service makes.
func plausibleChargeID(id string) bool {
	if id == "" || len(id) > maxChargeIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c < 0x21 || c > 0x7e {
			return false
		}
	}
	return true
}
