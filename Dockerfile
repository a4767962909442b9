# syntax=docker/dockerfile:1
# Build:            docker build -t farm-apiserver:0.1.0 .
# amd64 and arm64:  docker buildx build --platform linux/amd64,linux/arm64 -t <registry>/farm-apiserver:0.1.0 --push .
#
# Each platform is built natively (buildx runs the arm64 stage on an arm64 builder, or under
# QEMU emulation, which is slow with fat LTO), so the cargo command is exactly the one CI runs:
# no cross-compilation toolchain, no --target.

# Stable Rust (≥ the crate's rust-version, 1.89) on Debian 12: glibc 2.36, the same as the
# runtime image below, so the binary never needs a newer glibc than it finds. Both images are
# multi-arch (amd64, arm64).
FROM rust:1-bookworm AS builder
ARG TARGETPLATFORM
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs symbol.order ./
COPY src ./src
# The machinery (aggregated-apiserver) and the apply engine, workspace crates the server
# depends on.
COPY aggregated-apiserver ./aggregated-apiserver
COPY fieldmanager ./fieldmanager
# bench/ and etcd-proto/ (the etcd client's code generator) are workspace members: their
# manifests must be there even though they are not built. build.rs links with symbol.order.
COPY bench ./bench
COPY etcd-proto ./etcd-proto
# The dist profile (fat LTO) is what bench/run measures. The target/ cache is one per platform:
# buildx builds the platforms at the same time, and both would write target/dist/.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target,id=farm-apiserver-target-${TARGETPLATFORM} \
    cargo build --profile dist --locked -p farm-apiserver \
    && cp target/dist/farm-apiserver /farm-apiserver

# glibc + libgcc only (ring needs no OpenSSL); runs as the distroless nonroot user (65532), which
# the Deployment's runAsUser/runAsGroup repeat. Only the binary is added.
FROM gcr.io/distroless/cc-debian12:nonroot
LABEL org.opencontainers.image.title="farm-apiserver" \
      org.opencontainers.image.description="Kubernetes aggregated API server for farm.example.com/v1alpha" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /farm-apiserver /farm-apiserver
USER 65532:65532
EXPOSE 8443
ENTRYPOINT ["/farm-apiserver"]
# What manifests/base/deployment.yaml passes (it sets args, which replace these).
CMD ["--bind", "0.0.0.0:8443", "--tls-cert-file", "/etc/farm-apiserver/tls/tls.crt", "--tls-private-key-file", "/etc/farm-apiserver/tls/tls.key", "--log-format", "json"]
