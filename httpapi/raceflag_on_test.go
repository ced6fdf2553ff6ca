//go:build race

package httpapi_test

// raceDetector reports whether the tests run with -race, which slows the
// server several times over on a shared machine.
const raceDetector = true
