"""A rendered MiniCluster's mesh gate in the lab's stand-in of the operator's pods.

The pods of ``test_minicluster_pods`` (the operator's ``wait.sh`` stand-in runs
``commands.pre``: the ``/readyz`` wait, then the mesh gate on ``/gatez``), rendered
with a short ``--gate-timeout``:

* UDP between the pods of ranks 0 and 1 dropped (an nft rule in rank 1's pod, both
  ways, before vnetd starts): the Flux containers of both exit 1 once the gate's bound
  expires, and their log carries vnetd doctor's verdict: the rank that did not answer,
  and blocked UDP. Rank 2, which needs only rank 0, passes its gate.
* A foreign sidecar in rank 0's pod (a never-exiting stand-in of Istio's envoy: it
  listens on its capture ports 15001 and 15006 and installs the inbound capture its
  ``ISTIO_IN_REDIRECT`` chain makes, a redirect of the pod's TCP to 15006): rank 0's
  Flux container exits 1 at once naming it, and ``vnetd doctor`` run in that pod names
  it too. The other ranks pass their gates.

With UDP open the same pods pass the gate and complete: ``test_minicluster_pods``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import trio
from kube_pods import KubePod, shim_directory
from test_k8s_entrypoints import PATH, wait_exit
from test_minicluster_pods import SIZE, operator_pods, render

from vnetd.lab.open_lab import Lab, open_lab

GATE_TIMEOUT = 15
"""The rendered ``--gate-timeout``: short, so the test waits little."""
READY_BOUND = 60.0
"""vnetd's start and claim in a pod, before the gate starts counting."""
VERDICT_BOUND = 20.0
"""The verdict's probes (the doctor's row: up to 9 s, and the helpers' rows)."""
ENVOY_STAND_IN = """\
import signal, socket
listeners = [socket.create_server(("0.0.0.0", port)) for port in (15001, 15006)]
print("envoy stand-in: listening on 15001 15006", flush=True)
signal.pause()
"""
ISTIO_CAPTURE = """\
table ip istio_stand_in {
  chain prerouting {
    type nat hook prerouting priority dstnat;
    meta l4proto tcp tcp dport { 15008, 15090, 15021, 15020 } return
    meta l4proto tcp redirect to :15006
  }
}
"""
Obj = dict[str, Any]


@pytest.fixture
def shims() -> Any:  # noqa: ANN401 - the shim directory's iterator
    with shim_directory("vnetd-gate-shims-") as directory:
        yield directory


async def nft(lab: Lab, kube: KubePod, ruleset: str) -> None:
    path = kube.pod.dir / "ruleset.nft"
    path.write_text(ruleset)
    done = await lab.run(kube.pod, ["nft", "-f", str(path)])
    assert done.returncode == 0, done.stderr.decode()


async def start_all(pods: list[KubePod], name: str) -> None:
    for kube in pods:  # the operator's containers start together
        await kube.start("vnetd")
        await kube.start(name)


async def wait_for_line(kube: KubePod, container: str, text: str, bound: float) -> float:
    """Seconds until ``text`` is in the container's log (fails past ``bound``)."""
    start = time.monotonic()
    with trio.move_on_after(bound):
        while text not in kube.running[container].log_text():
            await trio.sleep(0.2)
        return time.monotonic() - start
    pytest.fail(f"no {text!r} within {bound:g} s:\n{kube.running[container].log_text()[-3000:]}")


async def test_blocked_udp_fails_the_gate_with_the_ranks_and_the_cause(shims: Path, tmp_path: Path):
    rendered = render(tmp_path, gate_timeout=GATE_TIMEOUT)
    name = rendered[1]["metadata"]["name"]
    with trio.fail_after(300):
        async with open_lab(SIZE + 2, with_etcd=False) as lab:
            pods = await operator_pods(lab, tmp_path, shims, rendered)
            far = pods[0].pod.underlay_ip
            await nft(lab, pods[1], f"""\
table inet udp_to_rank0 {{
  chain input {{ type filter hook input priority 0; ip saddr {far} meta l4proto udp drop; }}
  chain output {{ type filter hook output priority 0; ip daddr {far} meta l4proto udp drop; }}
}}
""")  # fmt: skip
            await start_all(pods, name)
            for kube in pods:
                await wait_for_line(kube, name, "vnetd ready", READY_BOUND)
            # Ranks 0 and 1 fail once the gate's bound has expired, with the verdict.
            for kube, pair in ((pods[0], "0 → 1"), (pods[1], "1 → 0")):
                flux = kube.running[name]
                took = await wait_for_line(
                    kube, name, "vnetd gate: timed out", GATE_TIMEOUT + VERDICT_BOUND
                )
                assert await wait_exit(flux, VERDICT_BOUND) == 1, flux.log_text()
                log = flux.log_text()
                print(f"rank {kube.pod.index}: gate expired {took:.1f} s after vnetd was ready")
                assert f"timed out after {GATE_TIMEOUT} s" in log, log
                assert f"{pair}    no_handshake: UDP blocked" in log, log
                assert "UDP port 51820 between their pods is dropped" in log, log
                assert "Traceback" not in kube.running["vnetd"].log_text()
            # Rank 2 needs only rank 0 (its parent in the tree), which answers it.
            await wait_for_line(pods[2], name, "vnetd gate open: rank 2", VERDICT_BOUND)


async def test_a_foreign_sidecar_refuses_the_gate_and_doctor_names_it(shims: Path, tmp_path: Path):
    rendered = render(tmp_path, gate_timeout=GATE_TIMEOUT)
    name = rendered[1]["metadata"]["name"]
    with trio.fail_after(300):
        async with open_lab(SIZE + 2, with_etcd=False) as lab:
            pods = await operator_pods(lab, tmp_path, shims, rendered)
            mesh = pods[0]
            envoy = await lab.start(mesh.pod, ["python3", "-c", ENVOY_STAND_IN])
            await nft(lab, mesh, ISTIO_CAPTURE)
            with trio.fail_after(10):
                while "listening" not in envoy.log_text():
                    await trio.sleep(0.1)
            await start_all(pods, name)
            flux = mesh.running[name]
            await wait_for_line(mesh, name, "vnetd ready", READY_BOUND)
            # Refused at once: waiting would not remove the sidecar.
            assert await wait_exit(flux, 10) == 1, flux.log_text()
            log = flux.log_text()
            assert (
                "vnetd gate refused: foreign sidecar in this pod: Istio's sidecar proxy "
                "(envoy) listens on its capture ports (TCP 15001 and 15006)" in log
            ), log
            assert "sidecar.istio.io/inject" in log and "timed out" not in log, log
            for kube in pods[1:]:
                await wait_for_line(kube, name, "vnetd gate open", VERDICT_BOUND)
            doctor = await lab.run(
                mesh.pod,
                ["env", f"PATH={shims}:{PATH}", "vnetd", "doctor", "--config",
                 "/etc/vnetd/mesh.toml", "--timeout", "30"],
                40, beside=mesh.sandbox,
            )  # fmt: skip
            out = doctor.stdout.decode()
            assert "note: foreign sidecar in this pod: Istio's sidecar proxy (envoy)" in out, (
                out + doctor.stderr.decode()
            )
            assert envoy.returncode is None, "the sidecar never exits"
