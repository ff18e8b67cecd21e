"""``vnetd render minicluster``, ``monitoring`` and ``provision``: parsers and runs.

``vnetd.commands.render.command.add_parser`` calls ``add_kinds`` with its subparsers;
each kind loads the spec, calls its pure renderer and prints the text or
writes it atomically. ``docs/flux.md`` documents ``minicluster``,
``docs/kubernetes.md`` ``monitoring`` and ``provision``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from vnetd.errors import SpecError
from vnetd.render.manifests import DEFAULT_IMAGE, manifest_warnings
from vnetd.render.minicluster import (
    DEFAULT_COMMAND,
    DEFAULT_DEADLINE,
    DEFAULT_MONITORING_NAMESPACE,
    MiniClusterOptions,
    render_minicluster,
)
from vnetd.render.monitoring import render_monitoring
from vnetd.render.operator_versions import (
    DEFAULT_OPERATOR_VERSION,
    DEFAULT_QUEUE_POLICY,
    OPERATOR_VERSIONS,
    QUEUE_POLICIES,
)
from vnetd.render.output import warn_on_stderr, write_file
from vnetd.render.podscripts import GATE_TIMEOUT
from vnetd.render.provision_job import render_provision
from vnetd.render.relays import relays_hint
from vnetd.render.site_manifests import site_part, site_warnings
from vnetd.spec import load_spec


def add_kinds(kinds: Any) -> None:  # noqa: ANN401 - argparse's subparsers type is private
    """Add the cluster kinds to ``vnetd render``."""
    minicluster = kinds.add_parser(
        "minicluster",
        help="a Flux Operator MiniCluster whose brokers use the overlay's fixed addresses",
    )
    _add_config_and_output(minicluster)
    options = [
        ("--image", "image", DEFAULT_IMAGE, "the vnetd image"),
        ("--app-image", "app_image", "the distribution of the version's Flux view",
         "the container Flux runs in"),
        # dest: "command" is the top-level subcommand's
        ("--command", "job_command", DEFAULT_COMMAND, "what the MiniCluster submits to Flux"),
    ]  # fmt: skip
    for flag, dest, default, text in options:
        metavar = flag[2:].upper().replace("-", "_")
        help_text = f"{text} (default {default})"
        value = None if flag == "--app-image" else default
        minicluster.add_argument(flag, dest=dest, metavar=metavar, default=value, help=help_text)
    minicluster.add_argument(
        "--operator-version",
        metavar="VERSION",
        default=DEFAULT_OPERATOR_VERSION,
        help=f"the Flux Operator installed: one of {', '.join(OPERATOR_VERSIONS)}, each a "
        f"release tag or commit vnetd was checked against (default {DEFAULT_OPERATOR_VERSION})",
    )
    minicluster.add_argument(
        "--deadline",
        type=int,
        metavar="SECONDS",
        default=DEFAULT_DEADLINE,
        help="how long the MiniCluster's Job may run before it fails (spec.deadlineSeconds, "
        f"default {DEFAULT_DEADLINE}: a working session, not the operator's year)",
    )
    minicluster.add_argument(
        "--gate-timeout",
        type=int,
        metavar="SECONDS",
        help="how long each pod's Flux container waits for the ranks its broker connects "
        "to to answer over the overlay before it exits 1 with vnetd doctor's verdict and "
        f"the Job fails (below --deadline; default {GATE_TIMEOUT}, or half --deadline "
        "when that is shorter)",
    )
    minicluster.add_argument(
        "--queue-policy",
        metavar="POLICY",
        default=DEFAULT_QUEUE_POLICY,
        help=f"Fluxion's queue policy: {', '.join(QUEUE_POLICIES)} (default "
        f"{DEFAULT_QUEUE_POLICY}, the operator's; the rendered broker config carries it)",
    )
    minicluster.add_argument(
        "--tasks",
        type=int,
        metavar="N",
        help="how many tasks the command runs as (default: one per pod it starts with)",
    )
    minicluster.add_argument(
        "--size",
        type=int,
        metavar="N",
        help="how many pods the MiniCluster starts with (spec.size; default every rank, "
        "its maxSize): Flux starts once N ranks are up and `kubectl scale` grows it",
    )
    minicluster.add_argument(
        "--site",
        metavar="NAME",
        help="render site NAME's part of a burst: vnetd gets --site NAME, and each gateway "
        "of the site among --ranks a UDP LoadBalancer Service and IP forwarding "
        "(docs/bursting.md)",
    )
    minicluster.add_argument(
        "--ranks",
        default="all",
        metavar="A-B",
        help="the ranks this MiniCluster runs (default all): its Job index i is rank A+i",
    )
    minicluster.add_argument(
        "--etcd",
        action="append",
        default=[],
        metavar="URL",
        help="etcd client URL vnetd uses instead of registry.endpoints, such as the other "
        "site's etcd; repeat for several",
    )
    add_relay_arguments(minicluster)
    minicluster.add_argument(
        "--batch",
        action="store_true",
        help="the operator's batch mode: each line of --command is submitted in one nested "
        "`flux batch` instance, whose brokers use the overlay interface like the others",
    )
    minicluster.add_argument(
        "--mesh-policy",
        action="store_true",
        help="also a NetworkPolicy admitting WireGuard's UDP port from the mesh's pods "
        "and the metrics port from --monitoring-namespace "
        "(for a namespace whose policies deny by default)",
    )
    minicluster.add_argument(
        "--kernel-wireguard",
        action="store_true",
        help="the least-privilege form: vnetd uses the node kernel's WireGuard "
        "(--dataplane kernel) and the pods mount no host path (no /dev/net/tun); "
        "every node needs the wireguard module",
    )
    minicluster.add_argument(
        "--monitoring-namespace",
        metavar="NAMESPACE",
        default=DEFAULT_MONITORING_NAMESPACE,
        help="where Prometheus runs, admitted to /metrics by --mesh-policy "
        f"(default {DEFAULT_MONITORING_NAMESPACE})",
    )
    minicluster.set_defaults(run=run_minicluster)

    monitoring = kinds.add_parser(
        "monitoring",
        help="a Prometheus Operator PodMonitor and PrometheusRule with the documented alerts",
    )
    _add_config_and_output(monitoring)
    monitoring.add_argument(
        "--expected-ranks",
        type=int,
        metavar="N",
        help="how many ranks VnetdRankMissing expects registered, e.g. the DaemonSet's "
        "desired number of nodes when fewer nodes than mesh.size carry its label "
        "(default mesh.size)",
    )
    monitoring.add_argument(
        "--minicluster",
        action="store_true",
        help="the pods are those of `vnetd render minicluster`: select them by the labels "
        "the Flux Operator keeps and scrape the vnetd container, which declares no port",
    )
    monitoring.set_defaults(run=run_monitoring)

    provision = kinds.add_parser(
        "provision",
        help="the Job that makes the mesh's etcd users (vnetd provision) and turns auth on",
    )
    _add_config_and_output(provision)
    provision.add_argument(
        "--image", default=DEFAULT_IMAGE, help=f"the vnetd image (default {DEFAULT_IMAGE})"
    )
    provision.add_argument(
        "--relay-user",
        metavar="NAME",
        help="also the relays' read-only etcd user (render manifests --relays), its "
        "password the key NAME of the mesh user's password Secret",
    )
    provision.set_defaults(run=run_provision)


def add_relay_arguments(parser: argparse.ArgumentParser) -> None:
    """``--relays N``, ``--relay-user NAME`` and ``--relay-issuer NAME`` (``render.relays``)."""
    parser.add_argument(
        "--relays",
        type=int,
        default=0,
        metavar="N",
        help="N vnetd relay pods the daemons read the members through, so etcd holds N "
        "member watches instead of one per daemon (about one per 100 ranks; default 0)",
    )
    parser.add_argument(
        "--relay-user",
        metavar="NAME",
        help="the relays' read-only etcd user where the spec names an etcd user "
        "(`vnetd render provision --relay-user NAME` makes it)",
    )
    parser.add_argument(
        "--relay-issuer",
        metavar="NAME",
        help="where the spec reaches etcd over TLS the relays serve HTTPS from the Secret "
        "<mesh>-relay-tls: also render its cert-manager Certificate from this Issuer "
        "(etcd-ca, which components/etcd-cert-manager ships)",
    )


def _add_config_and_output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", required=True, type=Path, metavar="FILE", help="the mesh spec (TOML)"
    )
    parser.add_argument(
        "-o", "--output", type=Path, metavar="PATH", help="write here atomically (default stdout)"
    )


def run_minicluster(args: argparse.Namespace) -> int:
    spec = load_spec(args.config)
    text = _spec_text(args.config)
    options = MiniClusterOptions(
        image=args.image,
        app_image=args.app_image,
        command=args.job_command,
        operator_version=args.operator_version,
        tasks=args.tasks,
        size=args.size,
        batch=args.batch,
        site=args.site,
        ranks=args.ranks,
        etcd=tuple(args.etcd),
        mesh_policy=args.mesh_policy,
        deadline=args.deadline,
        queue_policy=args.queue_policy,
        monitoring_namespace=args.monitoring_namespace,
        kernel_wireguard=args.kernel_wireguard,
        gate_timeout=args.gate_timeout,
        relays=args.relays,
        relay_user=args.relay_user,
        relay_issuer=args.relay_issuer,
    )
    rendered = render_minicluster(spec, text, options)
    part = site_part(spec, "sidecar", args.site, args.ranks)
    warnings = [*manifest_warnings(spec, args.image, options.etcd), *site_warnings(spec, part)]
    for warning in [*warnings, *relays_hint(spec, args.relays, args.relay_issuer)]:
        warn_on_stderr(warning)
    _write(rendered, args.output)
    return 0


def run_monitoring(args: argparse.Namespace) -> int:
    spec = load_spec(args.config)
    _write(render_monitoring(spec, args.expected_ranks, args.minicluster), args.output)
    return 0


def run_provision(args: argparse.Namespace) -> int:
    _write(render_provision(load_spec(args.config), args.image, args.relay_user), args.output)
    return 0


def _spec_text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror}") from None


def _write(text: str, output: Path | None) -> None:
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        write_file(output, text.encode())
