# The vnetd image: `vnetd` as the entrypoint, with wireguard-go (the
# userspace data plane) and wireguard-tools (`wg`, for inspection) from
# Debian 12. Build from the repository root:
#
#   docker build -t registry.example.org/vnetd:0.1.0 .
#
# No Docker engine runs on the machines this repository is developed and
# tested on, so this file is checked by reading, not by building.

FROM python:3.11-slim-bookworm

# wireguard-go is Debian 12's 0.0.20220316, the version the lab tests run;
# iproute2 gives `ip` for looking at the interface and its routes.
RUN apt-get update \
    && apt-get install -y --no-install-recommends wireguard-go wireguard-tools iproute2 \
    && rm -rf /var/lib/apt/lists/*

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Only what the package needs: pyproject.toml names README.md as its readme.
COPY pyproject.toml README.md /src/
COPY vnetd /src/vnetd
RUN pip install /src && rm -rf /src

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
