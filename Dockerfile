# syntax=docker/dockerfile:1
# Build: docker build -t farm-apiserver .
FROM rust:1-bookworm AS builder
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
# bench/ is a workspace member: its manifest must be there even though it is not built.
COPY bench ./bench
# The dist profile (fat LTO) is what bench/run measures.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --profile dist --locked -p farm-apiserver && cp target/dist/farm-apiserver /farm-apiserver

# glibc + libgcc only (ring needs no OpenSSL); runs as the distroless nonroot user (65532).
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /farm-apiserver /farm-apiserver
USER 65532:65532
EXPOSE 8443
ENTRYPOINT ["/farm-apiserver"]
CMD ["--bind", "0.0.0.0:8443", "--tls-cert-file", "/etc/farm-apiserver/tls/tls.crt", "--tls-private-key-file", "/etc/farm-apiserver/tls/tls.key", "--log-format", "json"]
