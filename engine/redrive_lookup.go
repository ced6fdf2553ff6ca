//go:build !chaos_broken

package engine

// skipLookupBeforeRedrive is false in every real build: a re-drive looks
// the reference up before sending it again (see redrive). The chaos suite
// builds the binary with the tag chaos_broken, which sets it, to prove
// that its checker catches the double captures that follow.
const skipLookupBeforeRedrive = false
