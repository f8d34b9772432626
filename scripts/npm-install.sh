#!/usr/bin/env bash
# Installs the npm packages the tests use, at the versions of their lockfiles:
# scripts/schema-ts/ (json-schema-to-typescript and typescript, for pkg/events'
# TestSchemasGenerateTypeScript), scripts/asyncapi/ (@asyncapi/parser, for
# docs' TestAsyncAPIValidates), scripts/redocly/ (@redocly/cli, for the
# recorder's TestOpenAPIRedoclyLint) and clients/typescript/ (openapi-typescript,
# openapi-fetch and typescript, for scripts/test-clients.sh).
#
# Idempotent and quick when nothing changed: `npm ci` runs only when the folder's
# node_modules was not installed from its current package-lock.json (a copy of
# the lockfile is kept in node_modules after a successful install).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

DIRS=(scripts/schema-ts scripts/asyncapi scripts/redocly clients/typescript)

if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
	echo "npm-install.sh: node and npm are needed (Debian: apt-get install nodejs npm)" >&2
	exit 1
fi

for dir in "${DIRS[@]}"; do
	stamp="$dir/node_modules/.installed-package-lock.json"
	if [ -f "$stamp" ] && cmp -s "$dir/package-lock.json" "$stamp"; then
		echo "npm-install.sh: $dir: up to date"
		continue
	fi
	echo "npm-install.sh: $dir: npm ci (node $(node --version), npm $(npm --version))"
	# --ignore-scripts: none of these packages needs an install script.
	(cd "$dir" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error)
	cp "$dir/package-lock.json" "$stamp"
done
