# The vnetd image: `vnetd` as the entrypoint, with wireguard-go (the
# userspace data plane), wireguard-tools (`wg`, for inspection) and iproute2
# (`ip`, which the DaemonSet's entrypoint uses) from Debian 12. No public
# image exists: build it and push it to a registry your cluster pulls from.
#
# The base is pinned by digest, which you resolve once and pass (a build
# without it stops at this FROM line). From the repository root:
#
#   docker buildx imagetools inspect python:3.11-slim-bookworm   # prints "Digest: sha256:..."
#   docker build --build-arg BASE_DIGEST=sha256:... -t registry.example.org/vnetd:0.1.0 .
#   docker push registry.example.org/vnetd:0.1.0
#
# No Docker engine runs on the machines this repository is developed and
# tested on, so no digest was resolved here and this file is checked by
# reading and by tests/unit/test_image.py, not by building.

ARG BASE_DIGEST
FROM python:3.11-slim-bookworm@${BASE_DIGEST}

ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="vnetd" \
      org.opencontainers.image.description="Rank-addressed WireGuard overlay for HPC on Kubernetes: fixed addresses, any start order" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="docker.io/library/python:3.11-slim-bookworm" \
      org.opencontainers.image.base.digest="${BASE_DIGEST}"

# wireguard-go 0.0.20220316 is Debian 12's, and the version every test of
# this repository runs (the lab and the data-plane contract suite): the image
# carries the userspace data plane that was tested. Newer upstream releases
# are not packaged for Debian 12; the build stops if the version differs.
RUN apt-get update \
    && apt-get install -y --no-install-recommends wireguard-go wireguard-tools iproute2 \
    && rm -rf /var/lib/apt/lists/* \
    && wireguard-go --version | grep -q 'v0\.0\.20220316'

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Exactly the locked dependencies, then the package without resolving again.
# Only what the package needs: pyproject.toml names README.md as its readme;
# .dockerignore keeps the netns lab (vnetd/lab) and the tests out.
COPY requirements.lock /src/
RUN pip install --no-deps -r /src/requirements.lock
COPY pyproject.toml README.md /src/
COPY vnetd /src/vnetd
RUN pip install --no-deps /src && pip check && rm -rf /src

# A non-root user for what needs no privilege: `vnetd render`, `plan`, and
# `wait` without --reachable. `vnetd up` cannot run as this user. wireguard-go
# needs CAP_NET_ADMIN to create the TUN interface (and read/write access to
# /dev/net/tun), and vnetd needs it for the address and routes (netlink).
# A process of a non-root user keeps the capabilities Kubernetes adds to its
# container only as ambient capabilities, which Kubernetes does not set, or
# through file capabilities on its binary, which a Python interpreter must
# not carry. So the vnetd containers in manifests/ run as UID 0 with every
# capability dropped but NET_ADMIN, no privilege escalation and a read-only
# root filesystem.
# `vnetd wait --reachable` also runs as root: wireguard-go's socket is 0700.
RUN groupadd --system --gid 10001 vnetd \
    && useradd --system --uid 10001 --gid 10001 --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin vnetd \
    && install -d -m 0700 /var/lib/vnetd
USER 10001:10001

ENTRYPOINT ["vnetd"]
CMD ["--help"]
