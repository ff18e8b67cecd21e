"""Records vouched for by the mesh (``[mesh] rank_ca``), against real etcd and wireguard-go.

Ranks 0, 1 and 2 of a 4-pod lab run with rank certificates from the mesh's CA: ranks
0 and 2 as plain hosts (``vnetd rank-cert``'s certificate, DER, and a key file), rank
1 as cert-manager's csi-driver would equip a pod (a PKCS8 PEM key of mode 0440, a PEM
certificate whose URI SAN names the pod ``lab-1-x7k2q``). A thief holding the shared
etcd credential (the lab's own) and a wireguard-go device of its own in pod 3 deletes
rank 1's entry and writes its own record there, signed by its own key and under its
own lease, four ways: with no certificate, with rank 2's certificate (public, in rank
2's record), with the holder's own certificate, and with a certificate for rank 1
from a CA of its own. Over each sampling window rank 0 never routes rank 1's address
to the thief, the thief's device receives nothing, rank 0 counts each refusal, and
rank 1 takes its entry back. A daemon given a certificate for another rank exits 2.
Rank 1's certificate renewed in place is carried by its record.
Unit twin: tests/unit/test_rank_cert.py.
"""

from __future__ import annotations

import base64
import re
import sys
import time
from collections.abc import AsyncIterator

import pytest
import trio
from bounds import form
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from test_rank_holder import Intruder, grant_lease, key_at, record_of

from vnetd.control import rank_cert
from vnetd.control.membership import encode_member, member_key
from vnetd.control.proof import Signer, create_signer_file
from vnetd.lab.cluster import MeshLab, http_get, write_spec
from vnetd.lab.open_lab import Lab, open_lab
from vnetd.model import Member
from vnetd.spec import load_spec

TTL = 5
PORT = 9090
SAMPLE_WINDOW = 3.0
"""How long each forgery is watched for a wrong route: a watch event reaches every
daemon in milliseconds here, and a peer added is handshaken with at once."""
TAKEN_BACK = 2 * TTL
"""Rank 1's entry is its own again: its view loses its entry at once (readers refuse
the forgery) and it claims over the refused entry; below two leases of the forgery."""

RENEWAL_CARRIED = 3 * rank_cert.RANK_CERT_POLL
"""The file is read every poll and the record rewritten at once: one poll and a write."""


@pytest.fixture
async def lab4() -> AsyncIterator[Lab]:
    async with open_lab(4) as built:
        yield built


def vouched_mesh(lab: Lab, ca: Signer) -> MeshLab:
    path = write_spec(lab.workdir / "mesh.toml", len(lab.pods), lab.etcd_urls, ttl=TTL)
    text = path.read_text().replace("[registry]", f'rank_ca = ["{ca.public_key}"]\n\n[registry]')
    path.write_text(text)
    mesh = MeshLab(lab, path, load_spec(path))
    assert mesh.spec.rank_ca == (ca.public_key,)
    return mesh


def plain_host(mesh: MeshLab, ca: Signer, rank: int) -> list[str]:
    """A key file and ``vnetd rank-cert``'s certificate for ``rank``: its flags."""
    key_file = mesh.lab.workdir / f"sign-{rank}.key"
    signer = create_signer_file(key_file, "")
    cert = mesh.lab.workdir / f"rank-{rank}.der"
    cert.write_bytes(rank_cert.issue(ca, signer.public_key, rank_cert.rank_uri("lab", rank),
                                     days=1))  # fmt: skip
    return ["--signing-key-file", str(key_file), "--rank-cert-file", str(cert)]


def csi_pod(mesh: MeshLab, ca: Signer, rank: int) -> tuple[list[str], Signer]:
    """``tls.key`` (PKCS8 PEM, 0440) and ``tls.crt`` (PEM) as the csi-driver writes them,
    the URI SAN templated from an Indexed Job's pod: its flags, and its key."""
    volume = mesh.lab.workdir / f"csi-{rank}"
    volume.mkdir()
    signer = Signer.generate()
    key = volume / "tls.key"
    key.write_bytes(signer.private_key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8,
                                                     NoEncryption()))  # fmt: skip
    key.chmod(0o440)
    csi_renew(mesh, ca, rank, signer)
    return ["--signing-key-file", str(key), "--rank-cert-file", str(volume / "tls.crt")], signer


def csi_renew(mesh: MeshLab, ca: Signer, rank: int, signer: Signer) -> str:
    """A new ``tls.crt`` for the same key (``reuse-private-key``); its base64 DER."""
    uri = f"vnetd://lab/default/lab-{rank}-x7k2q/0b5e-uid"
    der = rank_cert.issue(ca, signer.public_key, uri, days=1)
    block = base64.encodebytes(der).decode()
    crt = mesh.lab.workdir / f"csi-{rank}" / "tls.crt"
    crt.with_suffix(".new").write_text(
        f"-----BEGIN CERTIFICATE-----\n{block}-----END CERTIFICATE-----\n"
    )
    crt.with_suffix(".new").replace(crt)  # the csi-driver swaps its ..data link: atomic
    return base64.b64encode(der).decode()


async def refusals(mesh: MeshLab) -> int:
    """Rank 0's count of entries skipped as invalid and rewrites refused (/metrics)."""
    status, body = await http_get(mesh.lab, mesh.pod(0), f"http://127.0.0.1:{PORT}/metrics")
    assert status == 200, body
    found = re.findall(r"^vnetd_registry_(?:bad_entries|refused_rewrites)\S* (\d+)", body, re.M)
    assert found, body[:2000]
    return sum(int(n) for n in found)


async def test_a_stolen_etcd_credential_routes_no_rank_to_the_thief(lab4: Lab) -> None:
    lab = lab4
    with trio.fail_after(240):
        ca = Signer.generate()
        mesh = vouched_mesh(lab, ca)
        await mesh.start_rank(0, *plain_host(mesh, ca, 0), "--http-listen", f"127.0.0.1:{PORT}")
        csi_flags, signer1 = csi_pod(mesh, ca, 1)
        await mesh.start_rank(1, *csi_flags)
        await mesh.start_rank(2, *plain_host(mesh, ca, 2))
        await mesh.start_probes()
        await form(mesh, {0, 1, 2})
        real_key = await key_at(mesh, 0, 1)
        assert real_key is not None

        # A daemon holding rank 2's certificate cannot claim rank 3.
        create_signer_file(lab.workdir / "sign-3.key", "")
        argv = [sys.executable, "-m", "vnetd", "up", "--config", str(mesh.spec_path),
                "--rank", "3", "--state-dir", str(mesh.pod(3).state_dir),
                "--signing-key-file", str(lab.workdir / "sign-3.key"),
                "--rank-cert-file", str(lab.workdir / "rank-2.der")]  # fmt: skip
        refused = await lab.start(mesh.pod(3), argv, {"POD_IP": mesh.pod(3).underlay_ip})
        assert await refused.wait(30) == 2
        assert "field cert names rank 2, not rank 3" in refused.log_text()

        intruder = Intruder(mesh)
        intruder.pod = mesh.pod(3)
        rank0_key = await key_at(mesh, 1, 0)
        assert rank0_key is not None
        await intruder.start(rank0_key)
        thief = Signer.generate()
        thief_ca = Signer.generate()
        rank2_cert = str((await record_of(mesh, 2))["cert"])
        rank1_cert = str((await record_of(mesh, 1))["cert"])
        own_ca_cert = base64.b64encode(rank_cert.issue(
            thief_ca, thief.public_key, rank_cert.rank_uri("lab", 1), days=1)).decode()  # fmt: skip
        key1 = member_key(mesh.spec, 1)
        counted = await refusals(mesh)
        samples = 0
        for name, cert in [("no certificate", ""), ("rank 2's certificate", rank2_cert),
                           ("the holder's certificate", rank1_cert),
                           ("its own CA's certificate", own_ca_cert)]:  # fmt: skip
            lease = await grant_lease(lab, 120)
            forged = Member(1, intruder.public_key, f"{mesh.pod(3).underlay_ip}:51820",
                            "thief", time.time(), "x", signing_key=thief.public_key, cert=cert)  # fmt: skip
            value = encode_member(forged, thief, key=key1, lease=int(lease, 16))
            await lab.etcdctl("del", key1)
            await lab.etcdctl("put", "--lease", lease, key1, value.decode())
            deadline = trio.current_time() + SAMPLE_WINDOW
            while trio.current_time() < deadline:
                peers = await mesh.device_peers(0)
                assert intruder.public_key not in peers, (name, peers)
                assert await key_at(mesh, 0, 1) in (real_key, None), name
                samples += 1
                await trio.sleep(0.2)
            after = await refusals(mesh)
            assert after > counted, f"rank 0 counted no refusal of {name}"
            counted = after
            with trio.fail_after(TAKEN_BACK):
                while await key_at(mesh, 0, 1) != real_key:
                    await trio.sleep(0.2)
            record = await record_of(mesh, 1)
            assert record["public_key"] != intruder.public_key, name
        assert await intruder.received() == 0
        ping = await lab.run(mesh.pod(0), ["ping", "-c", "1", "-W", "2", mesh.address(1)], 5)
        assert ping.returncode == 0, ping.stdout.decode()
        log0 = mesh.daemons[0].log_text()
        assert "field cert" in log0 and "carries no field cert" in log0, log0[-2000:]
        log1 = mesh.daemons[1].log_text()
        # The holder got its entry back either way: it took the forged entry over, or (its
        # claim came between the thief's delete and put) wrote its record back over the put.
        assert "took over" in log1 or "wrote ours back" in log1, log1[-2000:]

        # The csi-driver renews rank 1's certificate in place: its record carries it.
        renewed = csi_renew(mesh, ca, 1, signer1)
        with trio.fail_after(RENEWAL_CARRIED):
            while (await record_of(mesh, 1)).get("cert") != renewed:
                await trio.sleep(0.5)
        assert await key_at(mesh, 0, 1) == real_key
        assert not mesh.dead_daemons()
        print(f"{samples} samples over 4 forgeries, rank 0 counted {counted} refusals")
