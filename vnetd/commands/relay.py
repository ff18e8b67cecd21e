"""``vnetd relay``: one list+watch on etcd for a mesh's members, served to many daemons.

The daemons name it in ``[registry] relays`` (or ``--relay``, ``VNETD_RELAYS``) and read
the members through it; their writes still go to etcd (docs/architecture.md, "Relay").
The relay reads with its own etcd credential (``--etcd-user``; read on the members
prefix is all it needs) and ignores the spec's relays. With ``--tls-cert`` and
``--tls-key`` it serves HTTPS (``registry.relay.tls``), which daemons verify with their
``registry.ca_file``.
"""

from __future__ import annotations

import argparse
import os
import signal
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vnetd.config import add_etcd_arguments, spec_from_args
from vnetd.spec import MeshSpec
from vnetd.spec.parse import check_listen

if TYPE_CHECKING:
    from vnetd.registry.relay.tls import RelayTls

DEFAULT_LISTEN = "0.0.0.0:2381"


def add_parser(sub: Any) -> None:  # noqa: ANN401 (argparse's private subparsers type)
    parser = sub.add_parser(
        "relay",
        help="serve a mesh's members to many daemons from one watch on etcd",
        description="Hold one list+watch on etcd for the mesh's members and serve them to "
        "daemons as the reads of etcd's JSON gateway they use (range and watch on the "
        "members prefix), so etcd sends each change once per relay, not once per daemon. "
        "Daemons name it in [registry] relays or with --relay URL.",
    )
    parser.add_argument("--config", required=True, type=Path, help="the mesh spec (TOML)")
    parser.add_argument(
        "--listen",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help=f"where daemons reach the relay; repeat for several (default {DEFAULT_LISTEN})",
    )
    parser.add_argument(
        "--window",
        type=int,
        default=None,
        metavar="EVENTS",
        help="recent events kept for daemons that resume a watch (default 20000); a daemon "
        "behind it lists again from the relay",
    )
    parser.add_argument(
        "--tls-cert",
        type=Path,
        metavar="FILE",
        help="serve HTTPS with this PEM certificate (with --tls-key); loaded again when the "
        "file changes. Daemons verify it with their registry.ca_file",
    )
    parser.add_argument(
        "--tls-key", type=Path, metavar="FILE", help="the certificate's PEM private key"
    )
    add_etcd_arguments(parser, relays=False)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Relay until SIGTERM or SIGINT; returns 0."""
    import trio

    from vnetd.errors import SpecError
    from vnetd.registry.relay.tls import RelayTls, server_context

    spec = spec_from_args(args, os.environ)
    listen = [check_listen(value, key="--listen") for value in args.listen] or [DEFAULT_LISTEN]
    if args.window is not None and args.window < 1:
        raise SpecError(f"--window: {args.window} is not a count of events; give 1 or more")
    tls = None
    if (args.tls_cert is None) != (args.tls_key is None):
        raise SpecError("--tls-cert and --tls-key go together: give both, or neither")
    if args.tls_cert is not None:
        tls = RelayTls(args.tls_cert, args.tls_key)
        server_context(tls)  # a file that does not load stops the start with one line
    trio.run(relay_until_signal, spec, listen, args.window, tls)
    return 0


async def relay_until_signal(
    spec: MeshSpec, listen: list[str], window: int | None, tls: RelayTls | None = None
) -> None:
    """Relay the members of ``spec``'s mesh on ``listen`` (over HTTPS with ``tls``) until
    SIGTERM or SIGINT.

    Raises:
        VnetdError: an address cannot be served, or the registry settings are unusable.
    """
    import trio

    from vnetd.control.membership import members_prefix
    from vnetd.errors import VnetdError, plain_errors
    from vnetd.registry import open_registry
    from vnetd.registry.relay.cache import WINDOW_EVENTS
    from vnetd.registry.relay.service import run_relay

    direct = replace(spec.registry, relays=())  # a relay reads etcd itself
    with plain_errors(), trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with open_registry(direct) as registry, trio.open_nursery() as nursery:
            prefix = members_prefix(spec)
            try:
                relay = partial(run_relay, window_events=window or WINDOW_EVENTS, tls=tls)
                await nursery.start(relay, registry, prefix, listen)
            except* OSError as group:
                error = group.exceptions[0]
                raise VnetdError(
                    f"--listen {', '.join(listen)}: cannot serve there: {error}"
                ) from None
            async for _signum in signals:
                nursery.cancel_scope.cancel()
                break
