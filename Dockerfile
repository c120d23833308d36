# syntax=docker/dockerfile:1
# The brokkr image: the one `brokkr` binary (broker, controllers, CLI) on a distroless base,
# running as a non-root user; the manifests in deploy/ also make its root filesystem read-only.
#
#   docker build -t brokkr:0.1.0 \
#     --build-arg BROKKR_COMMIT=$(git rev-parse HEAD) \
#     --build-arg BROKKR_BUILD_DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ) .
#
# crates/brokkr/tests/image.rs keeps this file in step with the workspace (toolchain, build
# command, binary path, user).

ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
# The build context has no .git: `brokkr version` gets its commit and date from here.
ARG BROKKR_COMMIT=unknown
ARG BROKKR_BUILD_DATE=
ENV BROKKR_COMMIT=${BROKKR_COMMIT} BROKKR_BUILD_DATE=${BROKKR_BUILD_DATE}
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p brokkr \
    && install -D -m 0755 target/release/brokkr /out/usr/local/bin/brokkr \
    && install -d -o 65532 -g 65532 -m 0750 /out/var/lib/brokkr

# glibc and libgcc only (brokkr links nothing else: TLS is rustls, SQLite is bundled).
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/ /
# The SQLite store's directory when run without --store (mount a volume there).
WORKDIR /var/lib/brokkr
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["/usr/local/bin/brokkr"]
CMD ["serve", "--listen", "0.0.0.0:8080"]
