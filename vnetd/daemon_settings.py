"""What ``vnetd up`` runs with: its flags, the environment, the spec and the host's facts,
resolved once into one frozen record before the daemon starts.

``vnetd up`` (the commands layer) reads the host's facts, each only when it is
needed: the hostname, the default route's address when neither ``--endpoint``
nor ``POD_IP`` gives the endpoint, the underlay's MTU when ``mesh.mtu`` is
``auto``. It resolves the rank first (``identity.resolve_rank_or_auto``, so a bad
rank is named before the host is read) and hands it here with the host's facts,
as plain values, and ``resolve_daemon_settings``
makes ``DaemonSettings``, the record the runtime takes: nothing below this
layer reads the environment. Every value has one source order (flag, then
environment, then spec), kept in ``vnetd.identity`` for what says who the
member is and here for the rest. ``--rank auto`` leaves the rank to the
registry: the record says ``auto``, and what depends on the rank is derived
from the record and the rank once it is known (``DaemonSettings.member``).
See the module map in docs/architecture.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Literal

from vnetd import __version__
from vnetd.config import Settings
from vnetd.dataplane.base import DEFAULT_WIREGUARD_LOG
from vnetd.errors import IdentityError
from vnetd.identity import (
    RankCertFile,
    named_file,
    resolve_instance,
    resolve_public_endpoint,
    resolve_rank_cert,
    resolve_signing_key_file,
    resolve_site,
)
from vnetd.model import Member
from vnetd.spec import MeshSpec, SiteSpec

ENV_EXIT_ON_FILE = "VNETD_EXIT_ON_FILE"
ENV_PRESHARED_KEY_FILE = "VNETD_PRESHARED_KEY_FILE"
ENV_WIREGUARD_LOG = "VNETD_WIREGUARD_LOG"


@dataclass(frozen=True, kw_only=True)
class DaemonSettings:
    """The daemon's inputs, resolved (``resolve_daemon_settings``)."""

    spec: MeshSpec
    """With ``[site]`` set to this member's site and public endpoint (the peers'
    endpoints are chosen by it)."""
    rank: int | Literal["auto"]
    """``auto``: the registry assigns it at run time."""
    endpoint: str
    """The underlay ``ip:port`` peers send to."""
    instance: str
    """The name that owns the claim (and the node's name for ``--rank auto``)."""
    mtu: int
    """The device's MTU: the spec's, or what ``auto`` gave for the underlay."""
    state_dir: Path
    dataplane: str | None
    """``--dataplane``; None: the spec's ``[wireguard] dataplane``."""
    resync_interval: float
    preshared_key: str | None = field(repr=False)
    signing_key_file: tuple[str, Path] | None
    """The record signing key's file and what named it; None: the state dir's."""
    rank_cert: RankCertFile | None = None
    """The rank certificate every record carries, read at start (and followed while
    running: ``control.rank_cert.follow_rank_cert``); None: none."""
    public_endpoint_file: Path | None
    """``--public-endpoint-file``, followed while running."""
    exit_file: Path | None
    """The file whose appearance ends the daemon; None: run until a signal."""
    wireguard_log: str = DEFAULT_WIREGUARD_LOG
    """wireguard-go's ``LOG_LEVEL`` (``VNETD_WIREGUARD_LOG``; ``verbose`` to debug
    handshakes)."""
    child_env: Mapping[str, str] = field(
        default_factory=lambda: MappingProxyType({}), repr=False, compare=False
    )
    """The environment ``vnetd up`` started with, handed on as it is to the one
    process the daemon starts (wireguard-go reads its own variables, the Go
    runtime's among them); read by nothing in the daemon."""

    @property
    def site(self) -> str:
        return self.spec.site.name

    @property
    def public_endpoint(self) -> str | None:
        return self.spec.site.public_endpoint

    def member(self, rank: int, public_key: str, signing_key: str, started: float) -> Member:
        """The record this daemon claims ``rank`` with (``device_id`` is set once the
        device is up)."""
        return Member(
            rank=rank,
            public_key=public_key,
            endpoint=self.endpoint,
            instance=self.instance,
            started=started,
            version=__version__,
            site=self.site,
            public_endpoint=self.public_endpoint,
            signing_key=signing_key,
            cert=self.rank_cert.cert if self.rank_cert else "",
        )


def resolve_daemon_settings(
    flags: Settings,
    env: Mapping[str, str],
    *,
    hostname: str,
    rank: int | Literal["auto"],
    endpoint: str,
    mtu: int,
) -> DaemonSettings:
    """``vnetd up``'s flags resolved with the environment, the spec and the host's facts.

    Args:
        flags: the flags as given, with the spec they resolved.
        env: the environment ``vnetd up`` started with.
        hostname: this host's name (the instance's last source).
        rank: ``identity.resolve_rank_or_auto``'s, resolved by the caller before it
            reads the host (a bad rank is named first), and not again here.
        endpoint: ``identity.resolve_endpoint``'s (the default route read by the
            caller only when ``identity.needs_default_route``).
        mtu: the spec's, or for ``mesh.mtu = "auto"`` the underlay's less
            WireGuard's overhead, read by the caller.

    Raises:
        VnetdError: naming the flag, variable or spec key at fault.
    """
    spec = flags.spec
    exit_file = resolve_exit_file(flags.exit_on_file, env)
    site = resolve_site(spec, flags.site, env)
    public_endpoint = resolve_public_endpoint(
        spec, flags.public_endpoint, env, flags.public_endpoint_file
    )
    return DaemonSettings(
        spec=replace(spec, site=SiteSpec(site, public_endpoint)),
        rank=rank,
        endpoint=endpoint,
        instance=resolve_instance(flags.instance, env, hostname),
        mtu=mtu,
        state_dir=flags.state_dir,
        dataplane=flags.dataplane,
        resync_interval=flags.resync_interval,
        preshared_key=resolve_preshared_key(flags.preshared_key_file, env, spec),
        signing_key_file=resolve_signing_key_file(flags.signing_key_file, env, spec),
        rank_cert=resolve_rank_cert(flags.rank_cert_file, env, spec),
        public_endpoint_file=flags.public_endpoint_file,
        exit_file=exit_file,
        wireguard_log=env.get(ENV_WIREGUARD_LOG, DEFAULT_WIREGUARD_LOG),
        child_env=MappingProxyType(dict(env)),
    )


def resolve_preshared_key(flag: str | None, env: Mapping[str, str], spec: MeshSpec) -> str | None:
    """The mesh's pre-shared key: ``--preshared-key-file``, ``VNETD_PRESHARED_KEY_FILE``,
    then ``[wireguard] preshared_key_file``; None when none is given."""
    from vnetd.keys import load_preshared_key  # cryptography: not for building the parsers

    named = named_file(("--preshared-key-file", flag), ENV_PRESHARED_KEY_FILE, env,
                       ("wireguard.preshared_key_file", spec.local.preshared_key_file))  # fmt: skip
    return None if named is None else load_preshared_key(named[1], named[0])


def resolve_exit_file(flag: Path | None, env: Mapping[str, str]) -> Path | None:
    """The file whose appearance ends the daemon: ``--exit-on-file``, then
    ``VNETD_EXIT_ON_FILE``; None: none (run until a signal).

    Raises:
        IdentityError: the flag is empty (argparse makes ``""`` the path ``.``, which
            exists: the daemon would end before it started) or names a directory.
    """
    if flag is not None:
        path, source = flag, "--exit-on-file"
    else:
        value = env.get(ENV_EXIT_ON_FILE, "").strip()
        if not value:
            return None
        path, source = Path(value), ENV_EXIT_ON_FILE
    if path == Path() or path.is_dir():
        raise IdentityError(
            f"{source}: {str(path)!r} is empty or a directory; name the file whose "
            "appearance ends the daemon (a launcher's job-done marker)"
        )
    return path
