"""etcd's peer port as the manifests configure it (manifests/etcd/statefulset.yaml): a
CA of its own (``--peer-trusted-ca-file``), client certificates required, and only the
CN ``etcd-peer`` (``--peer-cert-allowed-cn``), against real etcd 3.4 in the lab.

A certificate of the client CA, the CA every vnetd pod's certificate comes from, is
refused on the peer port even with the CN ``etcd-peer``; a certificate of the peer CA
with another CN is refused; the peer certificate is served (``GET /members``, etcd's
peer handler). So holding ``vnetd-etcd-client-tls`` does not make a pod a member,
whatever the NetworkPolicy lets through (docs/security.md, "The shipped etcd
credential").
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import trio
import yaml
from tlscerts import CertFiles, TestCA

from vnetd.lab.etcd import ETCD_BIN
from vnetd.lab.open_lab import open_lab

PEER_PORT = 2380
STATEFULSET = Path(__file__).parents[2] / "manifests" / "etcd" / "statefulset.yaml"


def manifest_flag(name: str) -> str:
    """A flag's value as the shipped etcd StatefulSet gives it."""
    (container,) = yaml.safe_load(STATEFULSET.read_text())["spec"]["template"]["spec"]["containers"]
    (value,) = [a.partition("=")[2] for a in container["args"] if a.startswith(f"--{name}=")]
    return value


ALLOWED_CN = manifest_flag("peer-cert-allowed-cn")
READY = 20.0
"""etcd answers on its peer port within a second or two here; a member that does not
within this is broken, and no failure of the peer check takes longer."""

PROBE = """
import httpx, json, ssl, sys
url, ca, pairs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
out = {}
for name, (cert, key) in pairs.items():
    context = ssl.create_default_context(cafile=ca)
    context.load_cert_chain(cert, key)
    try:
        response = httpx.get(url + "/members", verify=context, timeout=3)
        out[name] = {"status": response.status_code, "text": response.text[:120]}
    except httpx.HTTPError as exc:
        out[name] = {"status": None, "text": repr(exc)[:160]}
print(json.dumps(out))
"""


async def test_peer_port_takes_only_the_peer_cas_certificate_with_the_allowed_cn(
    tmp_path: Path,
) -> None:
    client_ca = TestCA(tmp_path / "client-ca", "vnetd etcd CA")
    peer_ca = TestCA(tmp_path / "peer-ca", "vnetd etcd peer CA")
    async with open_lab(2, with_etcd=False) as lab:
        member, outsider = lab.pods
        issued = peer_ca.issue(ALLOWED_CN, ips=(member.underlay_ip,))
        served = CertFiles(issued.cert.rename(tmp_path / "served.crt"),
                           issued.key.rename(tmp_path / "served.key"))  # fmt: skip
        url = f"https://{member.underlay_ip}:{PEER_PORT}"
        etcd = await lab.start(member, [
            ETCD_BIN, "--name", "m0", "--data-dir", str(tmp_path / "data"),
            "--listen-client-urls", "http://127.0.0.1:2379",
            "--advertise-client-urls", "http://127.0.0.1:2379",
            "--listen-peer-urls", url, "--initial-advertise-peer-urls", url,
            "--initial-cluster", f"m0={url}", "--peer-client-cert-auth",
            "--peer-trusted-ca-file", str(peer_ca.ca_file), "--peer-cert-file", str(served.cert),
            "--peer-key-file", str(served.key), f"--peer-cert-allowed-cn={ALLOWED_CN}",
        ], private_mount=False)  # fmt: skip
        candidates = {
            "peer CA, CN etcd-peer": peer_ca.issue(ALLOWED_CN),
            "peer CA, CN intruder": peer_ca.issue("intruder"),
            "client CA, CN etcd-peer": client_ca.issue(ALLOWED_CN),
            "client CA, vnetd's (no CN)": client_ca.issue("vnetd-client", common_name=False),
        }
        pairs = {name: [str(c.cert), str(c.key)] for name, c in candidates.items()}
        argv = [sys.executable, "-c", PROBE, url, str(peer_ca.ca_file), json.dumps(pairs)]
        answers: dict[str, dict[str, object]] = {}
        with trio.move_on_after(READY):
            while answers.get("peer CA, CN etcd-peer", {}).get("status") != 200:
                assert etcd.returncode is None, etcd.log_path.read_text()[-1500:]
                result = await lab.run(outsider, argv, 30)
                assert result.returncode == 0, result.stderr.decode()
                answers = json.loads(result.stdout)
                await trio.sleep(0.3)
        print(json.dumps(answers, indent=1))
        assert answers["peer CA, CN etcd-peer"]["status"] == 200, answers
        assert "m0" in str(answers["peer CA, CN etcd-peer"]["text"]), answers
        for name in ("peer CA, CN intruder", "client CA, CN etcd-peer",
                     "client CA, vnetd's (no CN)"):  # fmt: skip
            assert answers[name]["status"] is None, (name, answers[name])
        log = etcd.log_path.read_text()
        # etcd 3.4.23's words: the CN check, and the chain check against the peer CA.
        assert 'error "client certificate authentication failed"' in log, log[-1500:]
        assert "certificate signed by unknown authority" in log, log[-1500:]
