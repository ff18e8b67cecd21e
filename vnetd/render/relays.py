"""The relays of a rendered mesh: ``vnetd render manifests --relays N``.

A Deployment of N ``vnetd relay`` pods and a Service in front of them; every
daemon of the rendered mesh reads the members through that Service
(``VNETD_RELAYS``), so etcd holds one member watch per relay instead of one per
daemon (docs/architecture.md, "Relay"). The Service spreads the daemons'
connections over the relays; a daemon whose relay dies resumes its watch on
another through the same name, and on etcd when none answers.

The relays hold no more than they need: etcd's TLS client Secret and, where the
spec names an etcd user (auth on), the password of a read-only user of their
own (``--relay-user``, made by ``vnetd render provision --relay-user`` from the
same Secret as the mesh user's, key: the user's name), never the mesh user's.
They run as the image's non-root user, with no capability. Where the daemons reach
etcd over TLS (the spec names ``registry.ca_file``), the relays serve HTTPS with a
certificate of their own from the Secret ``<mesh>-relay-tls``, made by hand
(docs/kubernetes.md) or by cert-manager from a Certificate rendered with
``--relay-issuer`` (``SHIPPED_ISSUER`` where etcd's certificates come from
``manifests/components/etcd-cert-manager``), signed by etcd's CA, so the daemons
verify a relay with the CA file they verify etcd with; a relay loads a renewed
certificate itself (``registry.relay.tls``). Without TLS to etcd they serve plain
HTTP. Either way the records they serve are signed, and a daemon with
relays checks every record's proof, so a relay, or anyone on the path to it, can delay
a record but not change one unnoticed.

Pure: dictionaries only.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

from vnetd.errors import SpecError
from vnetd.render.pods import (
    CONFIG_DIR,
    ETCD_CLIENT_SECRET,
    RUNTIME_DEFAULT_SECCOMP,
    SPEC_KEY,
    config_volume,
    etcd_tls_dir,
    listens_on_ipv6,
    resources,
)
from vnetd.render.secretfiles import ETCD_PASSWORD_SECRET
from vnetd.spec import MeshSpec

Obj = dict[str, Any]

_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]{1,253}")
"""What Kubernetes takes as a Secret's key."""

RELAY_PORT = 2381
"""The port the relays serve on (``vnetd relay``'s default)."""
RELAY_USER_DIR = "/etc/vnetd-relay"
"""Where a relay mounts its etcd user's password (the file named after the user)."""
RELAY_TLS_DIR = "/etc/vnetd-relay-tls"
"""Where a relay mounts its own certificate's Secret (cert-manager's keys)."""
SHIPPED_ISSUER = "etcd-ca"
"""The cert-manager Issuer ``manifests/components/etcd-cert-manager`` ships: the CA of
etcd's server certificate, whose ca.crt every daemon holds (``--relay-issuer``)."""
RELAY_UID = 10001
"""The image's own user (Dockerfile ``USER``): a relay needs no privilege."""
DAEMONS_PER_RELAY = 100
"""The mesh size one relay is rendered for in the hint ``relays_hint`` gives."""
SIZE_FOR_RELAYS = 256
"""From this size on, ``render manifests`` without ``--relays`` warns (``relays_hint``)."""


def relay_name(spec: MeshSpec) -> str:
    """The Deployment's and the Service's name."""
    return f"{spec.name}-relay"


def relay_tls_secret(spec: MeshSpec) -> str:
    """The Secret cert-manager writes the relays' certificate into."""
    return f"{relay_name(spec)}-tls"


def relays_use_tls(spec: MeshSpec) -> bool:
    """Whether the relays serve HTTPS: the daemons verify etcd with a CA file."""
    return bool(spec.registry.ca_file)


def relay_url(spec: MeshSpec) -> str:
    """Where the daemons reach the relays: the Service, in the daemons' namespace."""
    scheme = "https" if relays_use_tls(spec) else "http"
    return f"{scheme}://{relay_name(spec)}:{RELAY_PORT}"


class RelayChoices(Protocol):
    """What a rendering asks of its relays (``ManifestOptions``, ``MiniClusterOptions``)."""

    @property
    def relays(self) -> int: ...
    @property
    def relay_user(self) -> str | None: ...
    @property
    def relay_issuer(self) -> str | None: ...


def check_relays(spec: MeshSpec, choices: RelayChoices) -> None:
    """Raises:
    SpecError: a count below 0, relays for a spec with an etcd user but no
        ``--relay-user`` (the relays would otherwise need the mesh user's password), an
        issuer for relays that serve no TLS.
    """
    relays, relay_user, issuer = choices.relays, choices.relay_user, choices.relay_issuer
    if issuer is not None and not (relays and relays_use_tls(spec)):
        raise SpecError(
            "--relay-issuer: it issues the certificate of relays that serve HTTPS, which "
            "they do where the spec reaches etcd over TLS (registry.ca_file); "
            + ("give --relays N too" if not relays else "this spec names no ca_file: drop it")
        )
    if relays < 0:
        raise SpecError(f"--relays: {relays} is not a count of relays; give 0 or more")
    if relay_user is not None and not _SECRET_KEY.fullmatch(relay_user):
        raise SpecError(
            f"--relay-user: {relay_user!r} cannot be a key of the Secret "
            f"{ETCD_PASSWORD_SECRET} its password comes from; use letters, digits, '-', "
            "'_' and '.'"
        )
    if relay_user is not None and not relays:
        raise SpecError("--relay-user: it names the relays' etcd user; give --relays N too")
    if relays and spec.registry.username and relay_user is None:
        raise SpecError(
            f"--relays: the spec's etcd user {spec.registry.username!r} may write the mesh, "
            "and relays only read it: give --relay-user NAME, a read-only user "
            "`vnetd render provision --relay-user NAME` makes (its password: key NAME of the "
            f"Secret {ETCD_PASSWORD_SECRET})"
        )
    if relay_user is not None and not spec.registry.username:
        raise SpecError(
            f"--relay-user: the spec names no etcd user (registry.username), so etcd's auth "
            f"is off for this mesh and {relay_user!r} would never be used; drop it"
        )


def relays_hint(spec: MeshSpec, relays: int, issuer: str | None = None) -> list[str]:
    """A warning for a large mesh rendered without relays, and for relays serving HTTPS
    from a Secret nothing rendered makes."""
    if relays and relays_use_tls(spec) and issuer is None:
        return [
            f"--relays: the relays serve HTTPS from the Secret {relay_tls_secret(spec)}, "
            "which these manifests do not make: create it first (docs/kubernetes.md, "
            '"Relays"), or give --relay-issuer etcd-ca where cert-manager issues etcd\'s '
            "certificates; until it exists the relay pods do not start"
        ]
    if relays or spec.size < SIZE_FOR_RELAYS:
        return []
    suggested = -(-spec.size // DAEMONS_PER_RELAY)
    return [
        f"--relays: none for {spec.size} ranks: every daemon then watches etcd itself, and a "
        f"formation costs etcd about {spec.size * spec.size:,} watch events; --relays "
        f'{suggested} serves them from {suggested} watches (docs/kubernetes.md, "Relays")'
    ]


def relay_objects(spec: MeshSpec, image: str, choices: RelayChoices, etcd: list[str]) -> list[Obj]:
    """The relays' Deployment and Service, and their Certificate with ``relay_issuer``
    (none for ``relays`` 0); ``etcd``: the daemons' ``--etcd`` flags, which the relays
    take too.

    Raises:
        SpecError: as ``check_relays``.
    """
    check_relays(spec, choices)
    relays, relay_user = choices.relays, choices.relay_user
    if not relays:
        return []
    name = relay_name(spec)
    labels = _labels(spec)
    issuer = choices.relay_issuer
    return [
        *([_certificate(spec, labels, issuer)] if issuer is not None else []),
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "selector": labels,
                "ports": [{"name": "relay", "port": RELAY_PORT, "protocol": "TCP"}],
            },
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "replicas": relays,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": _pod(spec, image, relay_user, etcd, labels),
                },
            },
        },
    ]


def with_relays(spec: MeshSpec, workload: Obj, relays: int) -> None:
    """Point the member reads of a workload's vnetd container (a Job's or a DaemonSet's)
    at the relays (none for ``relays`` 0)."""
    if not relays:
        return
    pod = workload["spec"]["template"]["spec"]
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        if container["name"] == "vnetd":
            container["env"].append({"name": "VNETD_RELAYS", "value": relay_url(spec)})


def _labels(spec: MeshSpec) -> Obj:
    return {
        "app.kubernetes.io/name": "vnetd-relay",
        "app.kubernetes.io/instance": spec.name,
        "app.kubernetes.io/part-of": "vnetd",
    }


def _pod(spec: MeshSpec, image: str, user: str | None, etcd: list[str], labels: Obj) -> Obj:
    listen = f"{'[::]' if listens_on_ipv6(spec) else '0.0.0.0'}:{RELAY_PORT}"
    args = ["relay", "--config", f"{CONFIG_DIR}/{SPEC_KEY}", "--listen", listen, *etcd]
    mounts = [{"name": "vnetd-config", "mountPath": CONFIG_DIR, "readOnly": True}]
    volumes = [config_volume(spec, "vnetd-config", SPEC_KEY)]
    tls_dir = etcd_tls_dir(spec, (CONFIG_DIR, RELAY_USER_DIR))
    if tls_dir is not None:
        mounts.append({"name": "etcd-client-tls", "mountPath": tls_dir, "readOnly": True})
        volumes.append(_secret("etcd-client-tls", ETCD_CLIENT_SECRET, None))
    if user is not None:
        args += ["--etcd-user", user, "--etcd-password-file", f"{RELAY_USER_DIR}/{user}"]
        mounts.append({"name": "relay-password", "mountPath": RELAY_USER_DIR, "readOnly": True})
        volumes.append(_secret("relay-password", ETCD_PASSWORD_SECRET, user))
    get: Obj = {"path": "/healthz", "port": RELAY_PORT}
    if relays_use_tls(spec):
        args += ["--tls-cert", f"{RELAY_TLS_DIR}/tls.crt", "--tls-key", f"{RELAY_TLS_DIR}/tls.key"]
        mounts.append({"name": "relay-tls", "mountPath": RELAY_TLS_DIR, "readOnly": True})
        volumes.append(_secret("relay-tls", relay_tls_secret(spec), None))
        get["scheme"] = "HTTPS"  # the kubelet does not verify the certificate of a probe
    # Ready while in step with etcd (/healthz); alive while it answers at all, so an etcd
    # outage takes a relay out of the Service but does not restart it.
    ready = {"httpGet": get, "timeoutSeconds": 3}
    alive = {"tcpSocket": {"port": RELAY_PORT}, "timeoutSeconds": 3}
    container = {
        "name": "relay",
        "image": image,
        "args": args,
        "ports": [{"name": "relay", "containerPort": RELAY_PORT, "protocol": "TCP"}],
        "readinessProbe": {**ready, "periodSeconds": 5, "failureThreshold": 2},
        "livenessProbe": {**alive, "periodSeconds": 10, "failureThreshold": 6},
        "resources": resources("100m", "64Mi", "256Mi"),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": mounts,
    }
    return {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RELAY_UID,
            "runAsGroup": RELAY_UID,
            "fsGroup": RELAY_UID,
            **RUNTIME_DEFAULT_SECCOMP,
        },
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": labels},
            }
        ],
        "containers": [container],
        "volumes": volumes,
    }


def _certificate(spec: MeshSpec, labels: Obj, issuer: str) -> Obj:
    """cert-manager's Certificate of the relays: the Service's name, from ``issuer``,
    renewed a month before it ends (the relays load the renewed files themselves)."""
    return {
        "apiVersion": "cert-manager.io/v1",
        "kind": "Certificate",
        "metadata": {"name": relay_name(spec), "labels": labels},
        "spec": {
            "secretName": relay_tls_secret(spec),
            "commonName": relay_name(spec),
            "dnsNames": [relay_name(spec)],
            "duration": "8760h",
            "renewBefore": "720h",
            "usages": ["server auth"],
            "privateKey": {"algorithm": "ECDSA", "size": 256},
            "issuerRef": {"name": issuer, "kind": "Issuer"},
        },
    }


def _secret(name: str, secret: str, key: str | None) -> Obj:
    """A Secret volume readable by the relay's group only (fsGroup); ``key``: that key alone."""
    source: Obj = {"secretName": secret, "defaultMode": 0o440}
    if key is not None:
        source["items"] = [{"key": key, "path": key}]
    return {"name": name, "secret": source}
