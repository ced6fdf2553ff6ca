//go:build race

package main

// raceDetector reports whether the tests run with -race, which slows the
// server several times over on a shared machine.
const raceDetector = true
