# toolwire — developer entry points.
#
# `make` (or `make help`) lists the targets. Every per-module target walks the
# modules of go.work as `go list -m` reports them, so a module added to go.work
# is picked up without touching this file.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
.DELETE_ON_ERROR:
MAKEFLAGS += --no-print-directory

# VCS stamping needs a .git directory and a git binary; builds in CI clones,
# containers and tarballs must not depend on either.
export GOFLAGS := -buildvcs=false

GO            ?= go
GOLANGCI_LINT ?= golangci-lint
BIN_DIR       ?= bin
# Extra arguments for `toolwire bench`, e.g. make bench BENCH_ARGS='--samples 200'.
BENCH_ARGS    ?=

# The binaries: the CLI and one per service (services/<name>/cmd/<name>).
SERVICES := orchestrator policy executor sandbox recorder
BIN_PKGS := ./cmd/toolwire $(foreach s,$(SERVICES),./services/$(s)/cmd/$(s))

# for_each_module runs the shell command $(1) in the directory of every module
# of the workspace, in `go list -m` order. It stops at the first module whose
# command fails and names that module. A module with no Go packages yet is
# skipped: `go vet ./...` and `go test ./...` exit non-zero on an empty match.
define for_each_module
for dir in $$($(GO) list -m -f '{{.Dir}}'); do \
	rel=$${dir#$(CURDIR)}; rel=.$${rel}; \
	if [ -z "$$(cd "$$dir" && $(GO) list -e ./... 2>/dev/null)" ]; then \
		echo "==> $$rel: no packages, skipped"; continue; \
	fi; \
	echo "==> $$rel"; \
	if ! (cd "$$dir" && $(1)); then \
		echo "FAILED in module $$rel ($$dir)" >&2; exit 1; \
	fi; \
done
endef

.PHONY: help
help: ## Show this list of targets
	@echo "Usage: make <target>"
	@echo
	@grep -hE '^[a-zA-Z0-9_.-]+:.*## ' $(MAKEFILE_LIST) \
		| awk 'BEGIN {FS = ":.*## "} {printf "  %-10s %s\n", $$1, $$2}'

.PHONY: run
run: ## Run everything in one process with an embedded NATS and demo data (toolwire dev --demo)
	$(GO) run ./cmd/toolwire dev --demo

.PHONY: test
test: ## go vet, then go test -race -count=1 in every module (stops at the first failing module), then the clients' tests, then the release check
	@$(call for_each_module,$(GO) vet ./... && $(GO) test -race -count=1 -timeout 15m ./...)
	@$(MAKE) test-clients
	@$(MAKE) release-check

.PHONY: test-clients
test-clients: ## The TypeScript and Python clients (clients/) against a live toolwire dev; needs scripts/npm-install.sh
	scripts/test-clients.sh

.PHONY: openapi-lint
openapi-lint: ## Lint the recorder's OpenAPI document with Redocly's recommended rules, failing on any warning (make test runs it as TestOpenAPIRedoclyLint)
	@bash scripts/npm-install.sh
	@cd services/recorder && CI=true $(GO) test -count=1 -run '^TestOpenAPIRedoclyLint$$' ./api/

.PHONY: test-race
test-race: ## Like test, but every test three times (-count=3) to shake out flaky races
	@$(call for_each_module,$(GO) vet ./... && $(GO) test -race -count=3 -timeout 15m ./...)

.PHONY: bench
bench: ## Go benchmarks of every module (-benchmem), then the end-to-end `toolwire bench`
	@$(call for_each_module,$(GO) test -run='^$$' -bench=. -benchmem ./...)
	@if $(GO) run ./cmd/toolwire bench --help >/dev/null 2>&1; then \
		$(GO) run ./cmd/toolwire bench $(BENCH_ARGS); \
	else \
		echo "==> toolwire bench: the end-to-end harness is not built yet; Go benchmarks only"; \
	fi

.PHONY: lint
lint: ## gofmt check, go vet per module, golangci-lint per module when installed
	@echo "==> gofmt -l"
	@files=$$(find . -name '*.go' -not -path './.git/*' -not -path '*/testdata/*' \
		-not -path './.toolwire/*' -not -path './bin/*' -print0 | xargs -0 -r gofmt -l); \
	if [ -n "$$files" ]; then \
		echo "These files are not gofmt-formatted (run gofmt -w on them):" >&2; \
		echo "$$files" >&2; exit 1; \
	fi
	@$(call for_each_module,$(GO) vet ./...)
	@if command -v $(GOLANGCI_LINT) >/dev/null 2>&1; then \
		$(call for_each_module,$(GOLANGCI_LINT) run ./...); \
	else \
		echo "==> golangci-lint not installed; skipped. Install it with:"; \
		echo "    go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@latest"; \
	fi
	@scripts/check-dockerfile-modules.sh

.PHONY: docs
docs: ## Regenerate the docs' generated parts from the code: environment, metrics, roles (docs/operations.md), events (docs/architecture.md), docs/asyncapi.yaml
	TOOLWIRE_UPDATE_DOCS=1 $(GO) test -count=1 -run '^TestDocTablesAreCurrent$$' ./docs/
	TOOLWIRE_UPDATE_DOCS=1 $(GO) test -count=1 -run '^TestAsyncAPIIsCurrent$$' ./docs/
	TOOLWIRE_UPDATE_DOCS=1 $(GO) test -count=1 -run '^TestEventTableIsCurrent$$' ./pkg/events/

.PHONY: tidy
tidy: ## go mod tidy in every module, as a dependent module sees it (siblings served from the checkout)
	$(GO) run ./scripts/release tidy

.PHONY: set-version
set-version: ## Require every sibling module at VERSION (make set-version VERSION=v0.2.0) and point go.work's replacements at it
	@test -n "$(VERSION)" || { echo "usage: make set-version VERSION=vX.Y.Z" >&2; exit 2; }
	$(GO) run ./scripts/release version $(VERSION)

.PHONY: release-check
release-check: ## Pack every module into a local module proxy; a fresh module outside the checkout requires, builds and tests the worker and the client
	$(GO) run ./scripts/release check

.PHONY: build
build: ## Build the CLI and the five service binaries into ./bin/
	@mkdir -p $(BIN_DIR)
	$(GO) build -o $(BIN_DIR)/ $(BIN_PKGS)
	@ls -l $(BIN_DIR)

.PHONY: clean
clean: ## Remove ./bin/
	rm -rf $(BIN_DIR)
