"""``vnetd register``: hold a rank's claim for a machine that runs no vnetd.

A plain WireGuard host (a router, a laptop, configured with ``vnetd render
wg-quick``) cannot claim its rank itself. This command claims it with the
host's public key and endpoint, with the daemon's own claim code
(``control.claim.ClaimHolder``: lease, keepalive, claim again when lost), and
holds it until SIGTERM or SIGINT, which revoke the lease; the cluster's
daemons add the host as a peer meanwhile. See docs/architecture.md,
"Registry layout" and "Sites".
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vnetd import __version__
from vnetd.config import (
    add_etcd_arguments,
    add_public_endpoint_file_argument,
    add_site_arguments,
    spec_from_args,
)
from vnetd.errors import IdentityError
from vnetd.identity import (
    resolve_endpoint,
    resolve_public_endpoint,
    resolve_rank,
    resolve_signing_key_file,
    resolve_site,
)
from vnetd.model import Member
from vnetd.spec import MeshSpec

if TYPE_CHECKING:
    from vnetd.control.proof import Signer
    from vnetd.registry import Registry


def add_parser(sub: Any) -> None:  # noqa: ANN401 (argparse's private subparsers type)
    parser = sub.add_parser(
        "register",
        help="hold a rank's claim for a plain WireGuard host until stopped",
        description="Claim RANK with a host's public key and endpoint, keep the lease "
        "alive until SIGTERM or SIGINT (which revoke it), so the mesh's daemons add the "
        "host as a peer. Configure the host with vnetd render wg-quick.",
    )
    parser.add_argument("--config", required=True, type=Path, help="the mesh spec (TOML)")
    parser.add_argument("--rank", required=True, help="the rank the host holds")
    parser.add_argument(
        "--public-key", required=True, metavar="KEY", help="the host's WireGuard public key"
    )
    parser.add_argument(
        "--endpoint",
        required=True,
        metavar="HOST:PORT",
        help="where the host's WireGuard listens, as its own site reaches it",
    )
    add_site_arguments(parser)
    add_public_endpoint_file_argument(parser)
    parser.add_argument(
        "--instance",
        help="the name that owns the claim (default register-<hostname>-<rank>)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        help="keep the record signing key here (made on first use, 0600), so readers know "
        "a restarted register as the same holder; without it, records are unsigned",
    )
    parser.add_argument(
        "--signing-key-file",
        metavar="FILE",
        help="sign with the record signing key in FILE (vnetd signing-key --create "
        "--key-file FILE makes one; mode 0600), instead of --state-dir's (else "
        "VNETD_SIGNING_KEY_FILE, else [wireguard] signing_key_file)",
    )
    add_etcd_arguments(parser)
    parser.set_defaults(run=run)


def member_of(args: argparse.Namespace, spec: MeshSpec, env: Mapping[str, str]) -> Member:
    """The record to claim, every flag checked (errors name the flag).

    Rank and endpoint are the flags' alone (the host's are not this machine's), by
    the rules ``vnetd up`` resolves them with (``vnetd.identity``), as are the site,
    the public endpoint and the signing key file (``run``), which may come from ``env``.
    """
    from vnetd.model import check_public_key

    rank = resolve_rank(spec, str(args.rank), {}, "")
    try:
        public_key = check_public_key(args.public_key.strip())
    except ValueError as exc:
        raise IdentityError(f"--public-key: {args.public_key!r} {exc}") from None
    return Member(
        rank=rank,
        public_key=public_key,
        endpoint=resolve_endpoint(spec, args.endpoint, {}, None),
        instance=args.instance or f"register-{socket.gethostname()}-{rank}",
        started=time.time(),
        version=__version__,
        site=resolve_site(spec, args.site, env),
        public_endpoint=resolve_public_endpoint(
            spec, args.public_endpoint, env, args.public_endpoint_file
        ),
    )


def run(args: argparse.Namespace) -> int:
    """Hold the claim until a signal; returns 0."""
    import trio

    spec = spec_from_args(args, os.environ)
    me = member_of(args, spec, os.environ)
    from vnetd.control.membership import check_pinned_signer
    from vnetd.control.proof import open_signer

    named = resolve_signing_key_file(args.signing_key_file, os.environ, spec)
    signer, source = open_signer(named, args.state_dir)
    check_pinned_signer(spec, me.rank, signer.public_key if signer else "", source)
    trio.run(hold_until_signal, spec, me, args.public_endpoint_file, signer)
    return 0


def signer_in(state_dir: Path) -> Signer:
    """The record signing key kept in ``state_dir`` (the directory made 0700 if new).

    A key of the process alone would not do: readers keep a public key bound to the
    signing key that registered it for a while after the entry goes, so a restarted
    register signing with a new key would be read as a copy of its own key.

    Raises:
        IdentityError: the directory cannot be made, or the key file is unusable.
    """
    from vnetd.control.proof import open_signer

    signer, _ = open_signer(None, state_dir)
    assert signer is not None  # a state dir is given
    return signer


async def hold_until_signal(
    spec: MeshSpec,
    me: Member,
    public_endpoint_file: Path | None = None,
    signer: Signer | None = None,
) -> None:
    """Claim ``me`` and hold it until SIGTERM or SIGINT; the lease is revoked on the way out."""
    import trio

    from vnetd.errors import plain_errors
    from vnetd.registry import open_registry

    with plain_errors(), trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with open_registry(spec.registry) as registry, trio.open_nursery() as nursery:
            nursery.start_soon(hold_claim, registry, spec, me, public_endpoint_file, signer)
            async for _signum in signals:
                nursery.cancel_scope.cancel()
                break


async def hold_claim(
    registry: Registry,
    spec: MeshSpec,
    me: Member,
    public_endpoint_file: Path | None = None,
    signer: Signer | None = None,
) -> None:
    """Check the spec, claim ``me.rank`` and hold it until cancelled, then revoke the lease;
    with ``public_endpoint_file``, register the public endpoint written there whenever
    it changes (as ``vnetd up`` does); with ``signer``, records are signed."""
    import trio

    from vnetd.control.claim import ClaimHolder
    from vnetd.control.endpoint_file import follow_public_endpoint
    from vnetd.control.membership import ensure_spec
    from vnetd.control.retry import RegistryHealth, retry_registry

    health = RegistryHealth()
    await retry_registry("spec check", lambda: ensure_spec(registry, spec), health)
    claim = ClaimHolder(registry, spec, me, health, signer=signer)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(claim.run)
            if public_endpoint_file is not None:
                nursery.start_soon(follow_public_endpoint, public_endpoint_file, claim)
    finally:
        await claim.release()
