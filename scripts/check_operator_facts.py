#!/usr/bin/env python3
"""Check each fact of ``vnetd/render/operator_versions.py`` against the Flux Operator's
own source, read from a local clone at the commit each version names.

    scripts/check_operator_facts.py PATH   # PATH: a clone (or bare git dir) of the operator

Run it when a version is added to the table or a fact changes. The operator's files
are read with ``git show COMMIT:PATH`` and never copied into this repository (they are
the operator's code, under its own licence); the test suite checks the facts that the
stored MiniCluster CRDs carry (``tests/unit/render/test_operator_versions.py``). Exits 1
when a fact does not hold, naming it.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vnetd.render.flux import FluxOptions, render_flux  # noqa: E402
from vnetd.render.minicluster import broker_config  # noqa: E402
from vnetd.render.operator_versions import (  # noqa: E402
    OPERATOR_VERSIONS,
    VIEW,
    OperatorVersion,
)
from vnetd.spec import load_spec  # noqa: E402

SPEC = Path(__file__).resolve().parents[1] / "manifests" / "sidecar" / "mesh.toml"
FILES = {
    "job.go": "controllers/flux/job.go",
    "minicluster.go": "controllers/flux/minicluster.go",
    "pods.go": "controllers/flux/pods.go",
    "view.go": "pkg/flux/view.go",
    "config.go": "pkg/flux/config.go",
    "start.sh": "pkg/flux/templates/start.sh",
    "wait.sh": "pkg/flux/templates/wait.sh",
}


class Source:
    """The operator's files at one commit of the clone at ``repo``."""

    def __init__(self, repo: Path, commit: str) -> None:
        self.repo, self.commit = repo, commit

    def __call__(self, name: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(self.repo), "show", f"{self.commit}:{FILES[name]}"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        if done.returncode:
            raise SystemExit(f"{self.repo}: {self.commit}:{FILES[name]}: {done.stderr.strip()}")
        return done.stdout


def script_facts(version: OperatorVersion, source: Source) -> None:
    start, wait = source("start.sh"), source("wait.sh")
    # A non-Flux container's command is one line of start.sh, after the socket wait.
    assert start.splitlines().count(version.command_line) == 1, "command line"
    assert start.index(version.command_line) > start.index(".Spec.Flux.NoWaitSocket") > 0
    # The marker vnetd exits on: wait.sh's last line, reached once the broker has exited.
    marker = version.marker.replace(VIEW, "$viewbase")
    assert wait.rstrip().splitlines()[-1] == f"touch {marker}", "marker"
    root = "configroot" if "/config/" in version.curve_cert else "viewroot"
    assert f"curvepath=${root}/curve/curve.cert" in wait, "CURVE path"
    assert version.config_root.endswith("/config" if root == "configroot" else "/view")
    # The tree the mesh gate waits on (wait.gate.tbon_neighbours), and no other topology.
    assert f"-Stbon.fanout={version.tbon_fanout} " in wait, "tbon.fanout"


def job_facts(version: OperatorVersion, source: Source) -> None:
    job = source("job.go")
    assert "ActiveDeadlineSeconds: &cluster.Spec.DeadlineSeconds" in job, "deadline"
    assert "RestartPolicy:                corev1.RestartPolicyOnFailure" in job, "OnFailure"
    assert "backoffLimit := int32(100)" in job, "backoff limit 100"
    settable = "backoffLimit = cluster.Spec.BackoffLimit" in job
    assert settable is version.backoff_limit, "backoff limit settable"
    if settable:  # 0 is "unset": the operator's 100
        assert re.search(r"if cluster\.Spec\.BackoffLimit != 0 \{\s*backoffLimit =", job)
    assert "Annotations: cluster.Spec.Pod.Annotations" in job, "pod annotations"


def operators_own_config(version: OperatorVersion, source: Source, queue: str) -> dict[str, Any]:
    """What ``generateBrokerConfig`` (view.go) writes for a MiniCluster given no broker
    config: its template with its ``Sprintf`` arguments in their order."""
    template = source("view.go").split("template := `", 1)[1].split("`", 1)[0]
    assert template.count("%s") == 7, "broker config template arguments"
    host_block = 'hosts = [\n{ host="flux-sample-[0-3]"},\n]\t\t\n'
    connect = "tcp://%h.flux-sample.default.svc.cluster.local:%p"
    arguments = (VIEW, VIEW, "tcp://eth0:%p", connect, host_block, VIEW, queue)
    config: dict[str, Any] = tomllib.loads(template.replace("%s", "{}").format(*arguments))
    return config


def broker_config_facts(version: OperatorVersion, source: Source) -> None:
    spec = load_spec(SPEC)
    bootstrap = tomllib.loads(render_flux(spec, FluxOptions(curve_cert=version.curve_cert)))
    for queue in ("fcfs", "easy"):
        ours = tomllib.loads(broker_config(spec, version.name, queue))
        theirs = operators_own_config(version, source, queue)
        assert ours.pop("bootstrap") == bootstrap["bootstrap"], "bootstrap is vnetd's"
        assert ours.pop("tbon") == {"interface-hint": spec.interface}, "vnetd's one addition"
        assert theirs.pop("bootstrap")["curve_cert"] == version.curve_cert, "CURVE path"
        assert ours == theirs, f"[resource], [access], [archive], queue policy {queue}"
    # view.go writes it through an unquoted here-document: nothing the shell expands.
    assert "cat <<EOT >>" in source("view.go"), "here-document"


def service_facts(version: OperatorVersion, source: Source) -> None:
    """Why the vnetd container declares no port: one Service per container name and
    namespace, selecting the first MiniCluster's pods (render/monitoring.py, docs/flux.md)."""
    reconcile = source("minicluster.go")
    assert "if container.RunFlux || len(container.Ports) == 0 {" in reconcile
    assert "selector := map[string]string{podLabelAppName: cluster.Name}" in reconcile
    assert "r.exposeService(ctx, cluster, container.Name, selector, container.Ports)" in reconcile
    pods = source("pods.go")
    assert "podLabels := cluster.Spec.Pod.Labels" in pods, "spec.pod.labels are kept"
    assert "podLabels[podLabelAppName] = cluster.Name" in pods, "name is overwritten"


def size_facts(version: OperatorVersion, source: Source) -> None:
    """What ``size``, ``maxSize`` and a burst site's part rely on (minicluster_site.py)."""
    job = source("job.go")
    assert "Completions:           &cluster.Spec.Size," in job, "size is the Job's"
    assert "Parallelism:           &cluster.Spec.Size," in job, "size is the Job's"
    assert "completionMode := batchv1.IndexedCompletion" in job, "an Indexed Job"
    view = source("view.go")
    assert "hosts := generateHostlist(cluster, cluster.Spec.MaxSize)" in view, "R's hosts"
    assert 'mainHost := fmt.Sprintf("%s-0", cluster.Name)' in view, "the lead host"
    config = source("config.go")
    assert "hosts = cluster.Spec.Flux.Bursting.Hostlist" in config, "bursting.hostlist"
    assert "if cluster.Spec.MaxSize == cluster.Spec.Size {" in config, "quorum only below"
    wait = source("wait.sh")
    assert "-Sbroker.quorum={{ .RequiredRanks }}" in wait, "quorum"
    lead = 'if [ $(hostname) == "${mainHost}" ]; then'
    assert wait.count(lead) == 1, "lead by host name"
    # pre runs in wait.sh's own shell before the branches that start the brokers: its
    # export (FLUX_FAKE_HOSTNAME) reaches every broker.
    assert 0 < wait.index("{{ .Container.Commands.Pre}}") < wait.index(lead), "pre"


CHECKS: list[Callable[[OperatorVersion, Source], None]] = [
    script_facts, job_facts, broker_config_facts, service_facts, size_facts,
]  # fmt: skip


def main() -> int:
    if not __debug__:  # the checks are assert statements, which -O strips
        raise SystemExit("run without python -O: the checks are assert statements")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("repo", type=Path, help="a clone (or bare git dir) of the operator")
    args = parser.parse_args()
    failed = 0
    for version in OPERATOR_VERSIONS.values():
        source = Source(args.repo, version.commit)
        for check in CHECKS:
            try:
                check(version, source)
            except AssertionError as exc:
                failed += 1
                print(f"{version.name}: {check.__name__}: FAILED {exc}")
            else:
                print(f"{version.name}: {check.__name__}: ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
