#!/usr/bin/env bash
# Runs the tests of the HTTP clients in clients/: the TypeScript package (its
# generated types current with services/recorder/api/openapi.yaml, tsc, then
# node --test) and the Python module (python3 -m unittest). Each suite starts
# its own `toolwire dev` (auth on, SQLite, free ports) from the binary built
# here once ($TOOLWIRE_BIN). `make test` calls it.
#
# A missing node, TypeScript packages (scripts/npm-install.sh) or python3 fails
# the run when CI=true, and skips that suite, saying so, otherwise.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

missing() {
	if [ "${CI:-}" = "true" ]; then
		echo "test-clients: FAILED: $*" >&2
		exit 1
	fi
	echo "test-clients: SKIPPED (CI=true fails instead): $*" >&2
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "==> clients: go build ./cmd/toolwire (the tests' toolwire dev)"
GOFLAGS=-buildvcs=false go build -o "$tmp/toolwire" ./cmd/toolwire
export TOOLWIRE_BIN="$tmp/toolwire"

echo "==> clients/typescript"
ts=clients/typescript
if ! command -v node >/dev/null 2>&1; then
	missing "node is not on PATH: install Node.js (Debian: apt-get install nodejs npm), then scripts/npm-install.sh"
elif [ ! -f "$ts/node_modules/openapi-typescript/bin/cli.js" ] || [ ! -f "$ts/node_modules/typescript/bin/tsc" ] ||
	[ ! -f "$ts/node_modules/openapi-fetch/package.json" ]; then
	missing "$ts/node_modules is not installed: run scripts/npm-install.sh (npm ci in $ts)"
else
	(
		cd "$ts"
		node scripts/check-generated.mjs
		rm -rf dist
		node node_modules/typescript/bin/tsc -p tsconfig.json
		node --test test/*.test.mjs
	)
fi

echo "==> clients/python"
if ! command -v python3 >/dev/null 2>&1; then
	missing "python3 is not on PATH (Debian: apt-get install python3)"
else
	python3 -m unittest discover -s clients/python -t clients/python -v
fi
