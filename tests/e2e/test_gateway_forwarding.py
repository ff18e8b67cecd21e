"""The gateway pods' forwarding init container, run as the kubelet would run it.

``vnetd render manifests --site`` gives every pod of a site with gateways a
privileged init container running ``FORWARDING_SCRIPT``; here it runs with
the rendered command in a fresh network and UTS namespace (``unshare``, gone
with the process), whose host name is the pod's: it turns forwarding on in a
gateway's namespace only, and never touches the namespace it was started from.
"""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from vnetd.render.manifests import ManifestOptions, render_manifests
from vnetd.spec import parse_spec

SPEC = """\
[mesh]
name = "flux"
size = 64
network = "10.250.0.0/24"
network6 = "fd00:250::/64"

[sites.a]
gateways = [0]

[sites.b]
gateways = [32, 33]
"""
SYSCTLS = (
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/send_redirects",
    "net/ipv6/conf/all/forwarding",
)


def forwarding_command() -> list[str]:
    options = ManifestOptions(site="b", ranks="32-63")
    text = render_manifests(parse_spec(tomllib.loads(SPEC)), SPEC, options)
    (workload,) = [d for d in yaml.safe_load_all(text) if d["kind"] == "StatefulSet"]
    init = workload["spec"]["template"]["spec"]["initContainers"]
    (container,) = [c for c in init if c["name"] == "vnetd-forwarding"]
    assert container["securityContext"]["privileged"] is True
    return container["command"]


def run_in_pod(host: str, command: list[str]) -> tuple[str, dict[str, str]]:
    """``command`` in a new netns named ``host``; its output and the sysctls after it."""
    reads = "; ".join(f"cat /proc/sys/{name}" for name in SYSCTLS)
    wrapper = f'echo "$1" > /proc/sys/kernel/hostname; shift; "$@" || exit 9; {reads}'
    result = subprocess.run(
        ["unshare", "--net", "--uts", "sh", "-c", wrapper, "pod", host, *command],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    *said, ip4, redirects, ip6 = result.stdout.splitlines()
    return "\n".join(said), dict(zip(SYSCTLS, (ip4, redirects, ip6), strict=True))


def read_sysctls() -> dict[str, str]:
    return {name: Path("/proc/sys", name).read_text().strip() for name in SYSCTLS}


@pytest.mark.parametrize("host", ["flux-32", "flux-33"])
def test_a_gateway_pod_forwards(host: str):
    before = read_sysctls()
    said, after = run_in_pod(host, forwarding_command())
    assert after == {
        "net/ipv4/ip_forward": "1",
        "net/ipv4/conf/all/send_redirects": "0",
        "net/ipv6/conf/all/forwarding": "1",
    }
    assert said == f"forwarding: on, IP versions 4 6 ({host} is a gateway of this site)"
    assert read_sysctls() == before, "the namespace the test runs in is untouched"


def test_another_pod_of_the_site_does_not_forward():
    said, after = run_in_pod("flux-40", forwarding_command())
    assert after["net/ipv4/ip_forward"] == "0" and after["net/ipv6/conf/all/forwarding"] == "0"
    assert said == "forwarding: unchanged (flux-40 is not a gateway of this site)"
