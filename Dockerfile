# syntax=docker/dockerfile:1
# Image of the cross-cluster-controller daemon.
#
#   docker build -t <registry>/cross-cluster-controller:0.1.0 .
#
# Stage 1 builds a static-ish release binary (rustls + aws-lc-rs, no OpenSSL); the last stage is
# a distroless image (glibc, CA certificates, no shell) running as the unprivileged user 65532.
#
# Build arguments: RUST_IMAGE (the builder), RUNTIME_IMAGE (the base of the image), and BINARY:
# `builder` (the default: compiled in stage 1) or `prebuilt` (a binary built beforehand, put at
# prebuilt/cross-cluster-controller in the build context: how scripts/build-image builds the
# image offline, with a runtime base assembled from Debian 12 packages).

ARG RUST_IMAGE=rust:1.95-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot
ARG BINARY=builder

FROM ${RUST_IMAGE} AS builder
WORKDIR /src
ENV CARGO_TERM_COLOR=never \
    CARGO_INCREMENTAL=0

# aws-lc-sys builds C code: it needs a C compiler (present) and, on some targets, cmake/clang.
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake clang \
 && rm -rf /var/lib/apt/lists/*

# 1. Dependencies only: a layer that changes only with Cargo.toml / Cargo.lock.
COPY Cargo.toml Cargo.lock ./
RUN mkdir src \
 && echo 'fn main() {}' > src/main.rs \
 && touch src/lib.rs \
 && cargo build --release --locked --bin cross-cluster-controller \
 && rm -rf src \
    target/release/cross-cluster-controller* \
    target/release/deps/cross_cluster_controller-* \
    target/release/deps/libcross_cluster_controller-* \
    target/release/.fingerprint/cross-cluster-controller-*

# 2. The real source.
COPY src ./src
RUN cargo build --release --locked --bin cross-cluster-controller \
 && install -D -m 0755 target/release/cross-cluster-controller /out/cross-cluster-controller \
 && /out/cross-cluster-controller --version

FROM scratch AS prebuilt
COPY prebuilt/cross-cluster-controller /out/cross-cluster-controller

FROM ${BINARY} AS binary

FROM ${RUNTIME_IMAGE}
LABEL org.opencontainers.image.title="cross-cluster-controller" \
      org.opencontainers.image.description="Mirrors labelled Services of a remote Kubernetes cluster into the local cluster as selectorless followers" \
      org.opencontainers.image.source="https://github.com/wearefair/cross-cluster-controller" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=binary /out/cross-cluster-controller /usr/local/bin/cross-cluster-controller
USER 65532:65532
# admin server: /healthz, /readyz, /metrics
EXPOSE 8080
ENV ENV=production
ENTRYPOINT ["/usr/local/bin/cross-cluster-controller"]
