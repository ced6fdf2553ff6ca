#!/usr/bin/env bash
# The quick tier (make test): the tests a newcomer runs first, with the race
# detector, in under 3 minutes on a 2-core machine, and without PostgreSQL,
# NATS, PgBouncer or Chromium. It is a selection of packages and tests, not
# a flag the tests read, so no test skips itself:
#
#   .               the docs' tests (the links, the test tiers, the
#                   README's commands) but TestDocsRunAsWritten, which
#                   builds the whole binary a second time, without -race
#                   (every dependency compiled twice: minutes on a fresh
#                   machine), to run the docs' shell blocks; the suite
#                   runs it
#   ./engine/       TestProtocolTable: every kind of money operation in
#                   every situation of the protocol, over HTTP on SQLite;
#                   admission, the back-off, the encoders
#   ./idempotency/  keys, fingerprints, ids
#   ./wire/         the request decoders (their fuzz seeds)
#   ./sqlite/       the store conformance suite (storetest/) on SQLite, and
#                   SQLite's own tests
#   ./acquirer/     the simulator
#
# The suite (./scripts/test.sh, the README's command and CI's) runs all of
# these and every other test. Extra arguments go to go test
# (./scripts/test-quick.sh -count=1 -v).
set -euo pipefail
cd "$(dirname "$0")/.."

QUICK_PACKAGES=(. ./engine/ ./idempotency/ ./wire/ ./sqlite/ ./acquirer/)
QUICK_SKIP='^TestDocsRunAsWritten$'

go test -race -timeout=10m -skip "$QUICK_SKIP" "$@" "${QUICK_PACKAGES[@]}"
