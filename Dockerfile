# syntax=docker/dockerfile:1
# te's image: te-sidecar (the entrypoint, for the per-pod sidecar container)
# plus libte.so, te.h and the Python packages (te, mooncake) for serving
# images to copy from it. Two stages on Debian 12: a build stage with Go, a
# slim runtime that runs as an unprivileged user.
#
#   docker build --build-arg TE_VERSION=$(make -s version) -t te:$(make -s version | tr + -) .
#   docker run --rm te:<tag> -version
#
# A serving image takes the library and the Python packages with
#   COPY --from=te:<tag> /opt/te /opt/te
#   ENV PYTHONPATH=/opt/te/python LD_LIBRARY_PATH=/opt/te/lib
# (te's mooncake.engine is then imported before a mooncake-transfer-engine
# wheel's; see examples/frameworks/README.md).

ARG GO_IMAGE=golang:1.26-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

FROM ${GO_IMAGE} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-pip python3-venv \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Modules first: this layer is reused while only the sources change.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# The build context carries no .git: the version comes in as an argument
# (mk/version.sh prints TE_VERSION when it is set).
ARG TE_VERSION=
RUN TE_VERSION="${TE_VERSION:-$(TE_VERSION= mk/version.sh)}" \
    make build/libte.so build/te-sidecar build/te-bench wheel \
 && mkdir -p /out/bin /out/te/lib /out/te/include /out/te/python \
 && cp build/te-sidecar build/te-bench /out/bin/ \
 && cp build/libte.so /out/te/lib/libte.so.1 && ln -s libte.so.1 /out/te/lib/libte.so \
 && cp include/te.h /out/te/include/ \
 && python3 -m pip install --no-deps --no-index --target /out/te/python build/wheel/te-*.whl \
 && cp LICENSE /out/te/

FROM ${RUNTIME_IMAGE}
# python3 for the Python packages; libibverbs1 and its providers let the
# rdma transport load (it is skipped, with a log line, where no NIC is).
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates python3 libibverbs1 ibverbs-providers \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 65532 te \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin te
COPY --from=build /out/bin/ /usr/local/bin/
COPY --from=build /out/te/ /opt/te/
ENV PYTHONPATH=/opt/te/python \
    LD_LIBRARY_PATH=/opt/te/lib
USER 65532:65532
# te-sidecar's port: HTTP metadata, the handoff, /healthz and /metrics.
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/te-sidecar"]
