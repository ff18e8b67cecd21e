"""The Flux Operator versions ``vnetd render minicluster`` supports: one table of facts.

Each version is a release tag or a commit, with the digest of its MiniCluster
CRD; each fact vnetd relies on is a field here, read from that version's
source at ``commit``: ``scripts/check_operator_facts.py`` checks each one against a
clone of the operator, and ``tests/unit/render/test_operator_versions.py`` those the
stored CRD carries.
Another version is refused with one line: the operator's scripts are
internals (the line ``start.sh`` runs a container's command on, the marker
``wait.sh`` touches, where it copies the CURVE certificate) and change between
commits.
"""

from __future__ import annotations

from dataclasses import dataclass

from vnetd.errors import SpecError

REPOSITORY = "https://github.com/flux-framework/flux-operator"
VIEW = "/mnt/flux"
"""The operator's default ``flux.container.mountPath``, where it puts Flux and its config."""


@dataclass(frozen=True)
class OperatorVersion:
    """What vnetd relies on in one version of the Flux Operator."""

    name: str
    """What ``--operator-version`` takes: the release tag, or a commit's short hash."""
    commit: str
    crd_sha256: str
    """``config/crd/bases/flux-framework.org_miniclusters.yaml`` at ``commit``."""
    install: str
    """The install YAML whose controller is this version (see ``controller_image``)."""
    controller_image: str | None
    """The controller image that YAML runs; None: built by the user from ``commit``
    (the YAML on the branch runs ``:latest``, rebuilt on every push)."""
    view_image: str
    """``flux.container.image``'s default: the Flux view copied into the application."""
    app_image: str
    """The default application image: the distribution the view was built on."""
    curve_cert: str
    """Where ``wait.sh`` copies the CURVE certificate (0400, the Flux user's)."""
    marker: str
    """What ``wait.sh`` touches in every pod once its broker has exited."""
    command_line: str
    """The line of ``start.sh`` a non-Flux container's ``command`` is inserted as."""
    core_security_context: bool
    """``securityContext`` is Kubernetes' own, not ``{privileged, addCapabilities}``."""
    backoff_limit: bool
    """``spec.backoffLimit`` exists (without it the Job's is the operator's fixed 100)."""
    tbon_fanout: int = 256
    """The ``tbon.fanout`` ``wait.sh`` starts every broker with (the mesh gate's tree)."""

    @property
    def config_root(self) -> str:
        """The directory of the broker config, R and the archive (``[resource]`` etc.)."""
        return self.curve_cert.removesuffix("/curve/curve.cert")


OPERATOR_VERSIONS = {
    version.name: version
    for version in (
        OperatorVersion(
            name="0d75cef8",
            commit="0d75cef855dee5351d68e32ec139a70e892b5268",
            crd_sha256="6c93155ad2f63171ded8ba050ad3730affb365ab47c6b30342ccc4bb9e2510d4",
            install="https://raw.githubusercontent.com/flux-framework/flux-operator/"
            "0d75cef855dee5351d68e32ec139a70e892b5268/examples/dist/flux-operator.yaml",
            controller_image=None,
            view_image="ghcr.io/converged-computing/flux-view-ubuntu:tag-noble",
            app_image="ubuntu:24.04",
            curve_cert=f"{VIEW}/config/curve/curve.cert",
            marker=f"{VIEW}/flux-operator-complete.txt",
            command_line="{{ .Container.Command }}",
            core_security_context=True,
            backoff_limit=True,
        ),
        OperatorVersion(
            name="0.2.1",
            commit="a7fce054906d3f994d7cba7f9f013536dce44dea",
            crd_sha256="400d1f5194615d6bae3023d0e1f552e7b224f3c503d8aa5c053c3796f1e91fec",
            install=f"{REPOSITORY}/releases/download/0.2.1/flux-operator.yaml",
            controller_image="ghcr.io/flux-framework/flux-operator:v0.2.1",
            view_image="ghcr.io/converged-computing/flux-view-rocky:tag-9",
            app_image="rockylinux:9",
            curve_cert=f"{VIEW}/view/curve/curve.cert",
            marker=f"{VIEW}/flux-operator-complete.txt",
            command_line="{{ .Container.Command }}",
            core_security_context=False,
            backoff_limit=False,
        ),
    )
}
"""The supported versions: a commit of the operator's main branch and its last release."""
DEFAULT_OPERATOR_VERSION = "0d75cef8"


QUEUE_POLICIES = ("fcfs", "easy", "hybrid", "conservative")
"""Fluxion's queue policies (``[sched-fluxion-qmanager] queue-policy``)."""
DEFAULT_QUEUE_POLICY = "fcfs"
"""The operator's default ``flux.scheduler.queuePolicy``."""


def broker_config(version: OperatorVersion, bootstrap: str, queue_policy: str) -> str:
    """The broker config the operator writes for a MiniCluster (``pkg/flux/view.go``,
    ``generateBrokerConfig``) with ``bootstrap`` in place of its ``[bootstrap]`` table.

    A given ``spec.flux.brokerConfig`` replaces the operator's whole file, so every other
    table is written here as the version writes it: ``[access]``, ``[resource]`` (the R
    its ``flux R encode`` writes), ``[archive]`` and the scheduler's queue policy.

    Raises:
        SpecError: ``queue_policy`` is not one of Fluxion's (naming the flag).
    """
    if queue_policy not in QUEUE_POLICIES:
        raise SpecError(
            f"--queue-policy: {queue_policy!r} is not a Fluxion queue policy; "
            f"give one of {', '.join(QUEUE_POLICIES)}"
        )
    root = version.config_root
    return (
        "[access]\nallow-guest-user = true\nallow-root-owner = true\n\n"
        f'[resource]\npath = "{root}/etc/flux/system/R"\n\n'
        f"{bootstrap}\n"
        f'[archive]\ndbpath = "{root}/var/lib/flux/job-archive.sqlite"\n'
        'period = "1m"\nbusytimeout = "50s"\n\n'
        f'[sched-fluxion-qmanager]\nqueue-policy = "{queue_policy}"\n'
    )


def operator_version(name: str) -> OperatorVersion:
    """Raises: SpecError: not a supported version (naming the flag and the choices)."""
    if name not in OPERATOR_VERSIONS:
        choices = ", ".join(OPERATOR_VERSIONS)
        raise SpecError(
            f"--operator-version: {name!r} is not a version vnetd was checked against; "
            f"install one of {choices} (docs/flux.md, section 5) and name it"
        )
    return OPERATOR_VERSIONS[name]
