#!/usr/bin/env bash
# Fails when a module of go.work has no `COPY <dir>/go.mod` line in the Dockerfile.
# The Dockerfile copies the go.mod files one by one (before the sources, so that
# `go mod download` stays a cached layer), and a module missing there would break
# the image build only later, inside `docker build`.
set -euo pipefail
cd "$(dirname "$0")/.."

root=$(pwd)
missing=0
for dir in $(go list -m -f '{{.Dir}}'); do
	rel=${dir#"$root"}
	rel=${rel#/}
	if [ -z "$rel" ]; then
		want='go.mod'
	else
		want="$rel/go.mod"
	fi
	if ! grep -Eq "^COPY[[:space:]]+${want//./\\.}[[:space:]]" Dockerfile; then
		echo "Dockerfile: no 'COPY ${want} ...' line for module ./${rel} (add it with the other go.mod lines)" >&2
		missing=1
	fi
done
if [ "$missing" -eq 0 ]; then
	echo "==> Dockerfile copies the go.mod of every module"
fi
exit "$missing"
