# syntax=docker/dockerfile:1
#
# One Dockerfile for every toolwire image. Pick the image with --target (or with
# the SERVICE build argument, which selects the final stage):
#
#   docker build --target executor -t ghcr.io/toolwire/executor:dev .
#   docker build --build-arg SERVICE=executor -t ghcr.io/toolwire/executor:dev .
#
# Targets: orchestrator, policy, executor, sandbox, recorder and toolwire (the CLI;
# `toolwire dev` runs everything in one container with an embedded NATS).
# All binaries are static (CGO_ENABLED=0) and run as the non-root uid 65532.

# Which target the last stage (the default image) is.
ARG SERVICE=toolwire
ARG GO_VERSION=1.26

# ---------------------------------------------------------------------------
# builder: compiles all six binaries into /out.
FROM golang:${GO_VERSION}-bookworm AS builder
WORKDIR /src
ENV CGO_ENABLED=0 \
    GOFLAGS=-buildvcs=false

# Module files first, so that `go mod download` stays cached until a go.mod or
# go.sum changes. One line per module of go.work: scripts/check-dockerfile-modules.sh
# (run by `make lint`) fails when a module is missing here.
COPY go.work go.work.sum* ./
COPY go.mod go.sum* ./
COPY pkg/envelope/go.mod pkg/envelope/go.sum* pkg/envelope/
COPY pkg/events/go.mod pkg/events/go.sum* pkg/events/
COPY pkg/jetstream/go.mod pkg/jetstream/go.sum* pkg/jetstream/
COPY pkg/embedded/go.mod pkg/embedded/go.sum* pkg/embedded/
COPY pkg/service/go.mod pkg/service/go.sum* pkg/service/
COPY pkg/rules/go.mod pkg/rules/go.sum* pkg/rules/
COPY services/orchestrator/go.mod services/orchestrator/go.sum* services/orchestrator/
COPY services/policy/go.mod services/policy/go.sum* services/policy/
COPY services/executor/go.mod services/executor/go.sum* services/executor/
COPY services/sandbox/go.mod services/sandbox/go.sum* services/sandbox/
COPY services/recorder/go.mod services/recorder/go.sum* services/recorder/
COPY client/go.mod client/go.sum* client/
COPY worker/go.mod worker/go.sum* worker/
COPY stack/go.mod stack/go.sum* stack/
# deploy/ holds the tests of these deploy files (Kubernetes and Docker
# libraries); the workspace needs its go.mod, no binary needs its modules.
COPY deploy/go.mod deploy/go.sum* deploy/
RUN set -eu; \
    for dir in $(go list -m -f '{{.Dir}}'); do \
        if [ "${dir}" = /src/deploy ]; then continue; fi; \
        echo "go mod download in ${dir}"; \
        (cd "${dir}" && go mod download); \
    done

COPY . .
RUN --mount=type=cache,target=/root/.cache/go-build \
    mkdir -p /out && \
    go build -trimpath -ldflags='-s -w' -o /out/ \
        ./cmd/toolwire \
        ./services/orchestrator/cmd/orchestrator \
        ./services/policy/cmd/policy \
        ./services/executor/cmd/executor \
        ./services/sandbox/cmd/sandbox \
        ./services/recorder/cmd/recorder && \
    ls -l /out

# ---------------------------------------------------------------------------
# runtime: distroless, no shell, CA certificates and tzdata included.
FROM gcr.io/distroless/static-debian12:nonroot AS runtime
COPY --from=builder /out/ /usr/local/bin/
WORKDIR /home/nonroot
USER nonroot:nonroot

FROM runtime AS orchestrator
ENV TOOLWIRE_HTTP_ADDR=:8081 OTEL_SERVICE_NAME=toolwire-orchestrator
EXPOSE 8081
ENTRYPOINT ["/usr/local/bin/orchestrator"]

FROM runtime AS policy
ENV TOOLWIRE_HTTP_ADDR=:8082 OTEL_SERVICE_NAME=toolwire-policy
EXPOSE 8082
ENTRYPOINT ["/usr/local/bin/policy"]

FROM runtime AS executor
ENV TOOLWIRE_HTTP_ADDR=:8083 OTEL_SERVICE_NAME=toolwire-executor
EXPOSE 8083
ENTRYPOINT ["/usr/local/bin/executor"]

FROM runtime AS recorder
# :8080 serves the public HTTP API and the timeline page as well as health and metrics.
ENV TOOLWIRE_HTTP_ADDR=:8080 OTEL_SERVICE_NAME=toolwire-recorder
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/recorder"]

FROM runtime AS toolwire
# `docker run -p 8080:8080 -p 127.0.0.1:4223:4223 <image>` starts the whole
# system with an embedded NATS: the API and timeline on :8080, NATS on :4223, the
# port the CLI looks for a dev server on, so `toolwire run` on the host needs no
# --nats. Inside the container both listen on every interface (a container's
# 127.0.0.1 is unreachable from outside it); `toolwire dev` on a host keeps to
# 127.0.0.1. The data lives in /home/nonroot/.toolwire (mount a volume there).
EXPOSE 8080 4223
ENTRYPOINT ["/usr/local/bin/toolwire"]
CMD ["dev", "--data-dir", "/home/nonroot/.toolwire", "--http", "0.0.0.0:8080", "--nats-listen", "0.0.0.0:4223"]

# ---------------------------------------------------------------------------
# sandbox: the job runtimes and the interpreter untrusted code runs in, all from
# Debian's packages, so it gets a slim Debian base instead of distroless:
#   bubblewrap  the bwrap runtime;
#   runsc       gVisor, the gvisor runtime (TOOLWIRE_SANDBOX_RUNTIME=auto prefers it);
#   python3     the interpreter (/usr/bin/python3, TOOLWIRE_SANDBOX_PYTHON);
# plus what the supervisor uses: /bin/sh (the gate) and setpriv (util-linux,
# for job uids when the service runs as root), both in the base image.
# At start the service runs a trial job in each runtime and keeps those that
# work here; /metrics shows which (toolwire_sandbox_runtime_available).
FROM debian:bookworm-slim AS sandbox
RUN set -eu; \
    apt-get update; \
    apt-get install -y --no-install-recommends bubblewrap runsc python3 ca-certificates; \
    rm -rf /var/lib/apt/lists/*; \
    groupadd --gid 65532 nonroot; \
    useradd --uid 65532 --gid 65532 --create-home --home-dir /home/nonroot --shell /usr/sbin/nologin nonroot
COPY --from=builder /out/sandbox /usr/local/bin/sandbox
WORKDIR /home/nonroot
USER 65532:65532
ENV TOOLWIRE_HTTP_ADDR=:8084 OTEL_SERVICE_NAME=toolwire-sandbox
EXPOSE 8084
ENTRYPOINT ["/usr/local/bin/sandbox"]

# ---------------------------------------------------------------------------
# The default image (no --target): the stage named by SERVICE.
FROM ${SERVICE} AS selected
