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
COPY pkg/service/go.mod pkg/service/go.sum* pkg/service/
COPY services/orchestrator/go.mod services/orchestrator/go.sum* services/orchestrator/
COPY services/policy/go.mod services/policy/go.sum* services/policy/
COPY services/executor/go.mod services/executor/go.sum* services/executor/
COPY services/sandbox/go.mod services/sandbox/go.sum* services/sandbox/
COPY services/recorder/go.mod services/recorder/go.sum* services/recorder/
RUN set -eu; \
    for dir in $(go list -m -f '{{.Dir}}'); do \
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
# `docker run -p 8080:8080 <image>` starts the whole system with an embedded NATS;
# its data lives in /home/nonroot/.toolwire (mount a volume there to keep it).
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/toolwire"]
CMD ["dev", "--data-dir", "/home/nonroot/.toolwire"]

# ---------------------------------------------------------------------------
# sandbox: needs bubblewrap (and later gVisor's runsc) and the interpreters that
# untrusted code runs in, so it gets a slim Debian base instead of distroless.
FROM debian:bookworm-slim AS sandbox
RUN set -eu; \
    apt-get update; \
    apt-get install -y --no-install-recommends bubblewrap python3 ca-certificates; \
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
