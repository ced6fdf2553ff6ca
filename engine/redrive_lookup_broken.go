//go:build chaos_broken

package engine

// skipLookupBeforeRedrive is true only in the deliberately broken build
// the chaos suite checks its checker with (go build -tags chaos_broken):
// a re-drive sends the reference again without looking it up, which
// captures twice once the acquirer has forgotten the reference.
const skipLookupBeforeRedrive = true
