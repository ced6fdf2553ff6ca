# The common tasks, with one obvious spelling each. `make help` lists them.
.PHONY: help run test test-v lint bench bench-full fuzz

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-8s %s\n", $$1, $$2}'

run: ## run the service on the embedded SQLite default
	go run ./cmd/chargeonce serve

test: ## the README's test command (finds or starts PostgreSQL by itself)
	go test -race ./...

test-v: ## the tests, printing their measurements (latencies, counts)
	go test -race -v -run 'Race|InFlight|Soak|Crash|CheapAnswers|Overload|AdmissionWait|Outage|Storm|GracefulShutdown' ./... 2>&1 | grep -E '^(=== RUN|--- |\s+\S+_test.go|ok|FAIL)'

lint: ## go vet and gofmt
	go vet ./...
	@test -z "$$(gofmt -l .)" || (gofmt -l . && exit 1)

bench: ## micro-benchmarks of the hot functions, with allocations
	go test -run '^$$' -bench . -benchmem ./idempotency/ ./engine/ ./httpapi/ ./replaycache/

bench-full: ## chargeonce bench: chargeonce against a bare handler and raw SQL (about 2 minutes)
	go run ./cmd/chargeonce bench

FUZZTIME ?= 2m
fuzz: ## run each fuzz target for FUZZTIME (default 2m; make fuzz FUZZTIME=30m for a longer run)
	go test -run '^$$' -fuzz '^FuzzParseKey$$' -fuzztime $(FUZZTIME) ./idempotency/
	go test -run '^$$' -fuzz '^FuzzFingerprint$$' -fuzztime $(FUZZTIME) ./idempotency/
	go test -run '^$$' -fuzz '^FuzzDecodeChargeRequest$$' -fuzztime $(FUZZTIME) ./httpapi/
