"""The ``vnetd render KIND`` and ``vnetd hosts`` subcommands.

Each kind loads the spec, checks its flags (a ``SpecError`` naming the
flag), calls its pure renderer and prints the text or writes it with
``output.write_file``. Only ``wg-quick`` reads the registry; ``manifests`` also
puts the spec file's text into its ConfigMap. ``docs/render.md``
documents every kind and flag.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vnetd.commands.render import cluster
from vnetd.config import add_etcd_arguments, spec_from_args
from vnetd.errors import SpecError
from vnetd.identity import resolve_site
from vnetd.render.flux import DEFAULT_CURVE_CERT, DEFAULT_PORT, FluxOptions, render_flux
from vnetd.render.hostfile import FORMATS, NAME_KINDS, render_hostfile
from vnetd.render.hosts import render_hosts_block
from vnetd.render.manifests import (
    DEFAULT_IMAGE,
    MODES,
    ManifestOptions,
    manifest_warnings,
    render_manifests,
)
from vnetd.render.output import Rename, update_hosts_file, warn_on_stderr, write_file
from vnetd.render.relays import relays_hint
from vnetd.render.site_manifests import site_part, site_warnings
from vnetd.spec import MeshSpec, load_spec

if TYPE_CHECKING:
    from vnetd.commands.render.members import RegistryOpener

_DOMAIN = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
WG_QUICK_MODE = 0o600


def add_parser(sub: Any) -> None:  # noqa: ANN401 - argparse's subparsers type is private
    """Add ``render`` (with one subcommand per kind) and ``hosts`` to the CLI."""
    render = sub.add_parser("render", help="print a consumer config rendered from the spec")
    kinds = render.add_subparsers(dest="kind", required=True, metavar="KIND")

    flux = kinds.add_parser("flux", help="Flux [bootstrap] TOML: one hosts entry per rank")
    _add_common(flux)
    flux.add_argument(
        "--curve-cert",
        default=DEFAULT_CURVE_CERT,
        metavar="PATH",
        help=f"the brokers' CURVE certificate (default {DEFAULT_CURVE_CERT})",
    )
    flux.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"broker port (default {DEFAULT_PORT})"
    )
    flux.add_argument(
        "--bind",
        choices=["address", "interface"],
        default="address",
        help="bind to the rank's overlay address (default) or the overlay interface",
    )
    flux.add_argument(
        "--fanout", type=int, metavar="K", help="add parent keys for a K-ary tree (K >= 1)"
    )
    _add_family(flux)
    flux.set_defaults(run=run_flux)

    hosts = kinds.add_parser("hosts", help="the /etc/hosts block of the mesh")
    _add_hosts_arguments(hosts)

    hostfile = kinds.add_parser("hostfile", help="an MPI host file, one entry per rank")
    _add_common(hostfile)
    hostfile.add_argument(
        "--format", choices=FORMATS, default="openmpi", help="host file syntax (default openmpi)"
    )
    hostfile.add_argument("--slots", type=int, default=1, help="slots per rank (default 1)")
    hostfile.add_argument(
        "--names",
        choices=NAME_KINDS,
        default="address",
        help="overlay addresses (default; need no hosts file) or hostnames",
    )
    _add_family(hostfile)
    hostfile.set_defaults(run=run_hostfile)

    wg_quick = kinds.add_parser(
        "wg-quick", help="a wg-quick config for a machine outside the cluster to hold a rank"
    )
    _add_common(wg_quick)
    wg_quick.add_argument("--rank", type=int, required=True, help="the rank this machine holds")
    wg_quick.add_argument(
        "--private-key-file",
        type=Path,
        metavar="PATH",
        help="the rank's private key (mode 0600); without it PrivateKey is a placeholder",
    )
    wg_quick.add_argument(
        "--site",
        metavar="NAME",
        help="the site this machine is in: peers of other sites get their public endpoint "
        "(else VNETD_SITE, else [site] name, else default)",
    )
    add_etcd_arguments(wg_quick)
    wg_quick.set_defaults(run=run_wg_quick)

    manifests = kinds.add_parser(
        "manifests",
        help="Kubernetes manifests: the spec's ConfigMap and an Indexed Job or DaemonSet",
    )
    _add_common(manifests)
    manifests.add_argument(
        "--image", default=DEFAULT_IMAGE, help=f"the vnetd image (default {DEFAULT_IMAGE})"
    )
    manifests.add_argument(
        "--mode",
        choices=MODES,
        default="sidecar",
        help="sidecar: an Indexed Job with vnetd as a native sidecar (default); "
        "daemonset: vnetd on host-network nodes, one rank per node",
    )
    manifests.add_argument(
        "--site",
        metavar="NAME",
        help="render the part of site NAME: the sidecars get --site NAME, and each gateway "
        "of the site among --ranks a UDP LoadBalancer Service and IP forwarding",
    )
    manifests.add_argument(
        "--etcd",
        action="append",
        default=[],
        metavar="URL",
        help="etcd client URL the daemons use instead of registry.endpoints, such as the "
        "other site's etcd; repeat for several",
    )
    manifests.add_argument(
        "--ranks",
        default="all",
        metavar="A-B",
        help="the ranks this cluster runs (default all): an Indexed Job when A is 0, "
        "else a StatefulSet whose pods are named after ranks A..B",
    )
    cluster.add_relay_arguments(manifests)
    manifests.set_defaults(run=run_manifests)
    cluster.add_kinds(kinds)

    top_hosts = sub.add_parser("hosts", help="print or update the /etc/hosts block of the mesh")
    _add_hosts_arguments(top_hosts)


def _add_common(parser: argparse.ArgumentParser, *, output: bool = True) -> None:
    parser.add_argument(
        "--config", required=True, type=Path, metavar="FILE", help="the mesh spec (TOML)"
    )
    if output:
        _add_output(parser)


def _add_family(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--family",
        type=int,
        choices=(4, 6),
        help="dual stack: write the IPv4 or IPv6 addresses (default: those of mesh.network)",
    )


def _add_output(parser: argparse.ArgumentParser | argparse._MutuallyExclusiveGroup) -> None:
    parser.add_argument(
        "-o", "--output", type=Path, metavar="PATH", help="write here atomically (default stdout)"
    )


def _add_hosts_arguments(parser: argparse.ArgumentParser) -> None:
    _add_common(parser, output=False)
    parser.add_argument("--domain", help="also name each rank HOSTNAME.DOMAIN (listed first)")
    where = parser.add_mutually_exclusive_group()
    _add_output(where)
    where.add_argument(
        "--write",
        type=Path,
        metavar="PATH",
        help="replace this mesh's block in a hosts file such as /etc/hosts, or append it",
    )
    parser.set_defaults(run=run_hosts)


def run_flux(args: argparse.Namespace) -> int:
    spec = load_spec(args.config)
    options = FluxOptions(
        curve_cert=_curve_cert(args.curve_cert),
        port=_int_in("--port", args.port, 1, 65535),
        bind=args.bind,
        fanout=None if args.fanout is None else _int_in("--fanout", args.fanout, 1),
        family=_family(spec, args.family),
    )
    _emit(render_flux(spec, options), args.output)
    return 0


def run_hosts(args: argparse.Namespace, rename: Rename = os.replace) -> int:
    """``vnetd hosts`` and ``vnetd render hosts``; ``rename`` is for tests."""
    spec = load_spec(args.config)
    block = render_hosts_block(spec, _domain(args.domain))
    if args.write is not None:
        update_hosts_file(args.write, block, spec.name, rename=rename)
    else:
        _emit(block, args.output)
    return 0


def run_hostfile(args: argparse.Namespace) -> int:
    spec = load_spec(args.config)
    slots = _int_in("--slots", args.slots, 1)
    family = _family(spec, args.family)
    version = spec.network.version if family is None else family
    if args.format == "mpich" and args.names == "address" and version == 6:
        hint = "add --names hostname" + (" or --family 4" if 4 in spec.versions else "")
        raise SpecError(
            "--format mpich: Hydra splits NAME:N at every ':', so it cannot read IPv6 "
            f"addresses; {hint}"
        )
    _emit(render_hostfile(spec, args.format, slots, args.names, family), args.output)
    return 0


def run_manifests(args: argparse.Namespace) -> int:
    spec = load_spec(args.config)
    try:
        text = args.config.read_text()
    except OSError as exc:
        raise SpecError(f"{args.config}: cannot read: {exc.strerror}") from None
    etcd = tuple(args.etcd)
    options = ManifestOptions(
        args.mode,
        args.image,
        args.site,
        args.ranks,
        etcd,
        args.relays,
        args.relay_user,
        args.relay_issuer,
    )
    rendered = render_manifests(spec, text, options)
    part = site_part(spec, args.mode, args.site, args.ranks)
    warnings = [*manifest_warnings(spec, args.image, etcd), *site_warnings(spec, part)]
    for warning in [*warnings, *relays_hint(spec, args.relays, args.relay_issuer)]:
        warn_on_stderr(warning)
    _emit(rendered, args.output)
    return 0


def run_wg_quick(args: argparse.Namespace, open_registry: RegistryOpener | None = None) -> int:
    """``vnetd render wg-quick``; ``open_registry`` is for tests (default etcd)."""
    from vnetd.commands.render.members import read_members_now
    from vnetd.keys import load_private_key
    from vnetd.render.wgquick import registration_problem, render_wg_quick

    spec = spec_from_args(args, os.environ)
    spec = replace(spec, site=replace(spec.site, name=resolve_site(spec, args.site, os.environ)))
    rank = _rank(spec, args.rank)
    key = load_private_key(args.private_key_file) if args.private_key_file else None
    members, bad = read_members_now(spec, open_registry)
    if bad:
        warn_on_stderr(f"skipped {bad} registry entries of mesh {spec.name} that are not members")
    if key is None:
        warn_on_stderr(
            f"PrivateKey is a placeholder: put the private key of rank {rank} there, "
            "or pass --private-key-file"
        )
    problem = registration_problem(rank, members, key.public_key if key else None)
    if problem:
        warn_on_stderr(problem)
    _emit(render_wg_quick(spec, rank, members, key), args.output, mode=WG_QUICK_MODE)
    return 0


def _emit(text: str, output: Path | None, mode: int | None = None) -> None:
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        write_file(output, text.encode(), mode=mode)


def _int_in(flag: str, value: int, low: int, high: int | None = None) -> int:
    if value < low or (high is not None and value > high):
        bound = f"{low}..{high}" if high is not None else f"at least {low}"
        raise SpecError(f"{flag}: {value} is out of range ({bound})")
    return value


def _family(spec: MeshSpec, family: int | None) -> int | None:
    """``--family``: None (the primary network's), or a version the mesh has."""
    if family is None or family in spec.versions:
        return family
    fix = "add mesh.network6 to the spec" if family == 6 else "the mesh is IPv6 only"
    raise SpecError(
        f"--family {family}: mesh {spec.name} has no IPv{family} network ({fix}); "
        "leave --family out"
    )


def _rank(spec: MeshSpec, rank: int) -> int:
    if not 0 <= rank < spec.size:
        raise SpecError(
            f"--rank: {rank} is out of range: mesh {spec.name} has ranks 0..{spec.size - 1}"
        )
    return rank


def _domain(value: str | None) -> str | None:
    if value is None:
        return None
    if not _DOMAIN.fullmatch(value):
        raise SpecError(
            f"--domain: {value!r} is not a DNS domain (labels of letters, digits and '-', "
            "joined by '.', without a leading or trailing '.')"
        )
    return value


def _curve_cert(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise SpecError(f"--curve-cert: {value!r} is not valid UTF-8") from None
    if not value or _CONTROL.search(value):
        raise SpecError(
            f"--curve-cert: {value!r} must be a non-empty path without control characters"
        )
    return value
