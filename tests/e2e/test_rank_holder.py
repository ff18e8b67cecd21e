"""A rank belongs to its holder: forgeries from public data, against real etcd and wireguard-go.

An intruder here has what every pod has: write access to the mesh's prefix
and everything public (each record, its ``instance``, every public key). It
rewrites a live member's record with its own key (keeping the holder's
``instance``), replaces it by a delete and a create, copies a member's key
to a free rank, or runs as a second daemon under the same instance. Every
daemon keeps the rank on its holder's key, or the holder says it was
displaced (docs/architecture.md, "Registry layout"; docs/security.md,
"Within one credential"). A daemon cut off from etcd while another pod
claims its rank stops saying it is ready. Issue 44: a leaseless entry, even one
signed by the attacker's own key, is no member (also with etcd auth on and the
shared mesh user), and an older record of a holder put back is refused.
"""

from __future__ import annotations

import json
import re
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path

import trio
from bounds import form
from test_faults_process import wait_log
from test_scoped_credentials import as_user, secured_lab, tls_flags, vnetd_in

from vnetd.control.membership import decode_member, encode_member, member_key
from vnetd.control.proof import SIGNING_KEY_FILE, Signer, create_signer_file, load_signer
from vnetd.lab.cluster import MeshLab, http_get
from vnetd.lab.netns import signal_pid
from vnetd.lab.open_lab import Lab, open_lab
from vnetd.lab.pods import LabProcess, Pod
from vnetd.lab.underlay import ETCD_IP, ETCD_PORT
from vnetd.model import Member

PORT = 9090
TTL = 5
WG_ENV = {"WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD": "1"}


async def record_of(mesh: MeshLab, rank: int) -> dict[str, object]:
    result = await mesh.lab.etcdctl("get", "--print-value-only", member_key(mesh.spec, rank))
    record: dict[str, object] = json.loads(result.stdout)
    return record


async def key_at(mesh: MeshLab, on: int, rank: int) -> str | None:
    """The public key ``on``'s device holds ``rank``'s /32 on (None: no peer has it)."""
    for row in await mesh.device_dump(on):
        if f"{mesh.address(rank)}/32" in row[3].split(","):
            return row[0]
    return None


async def grant_lease(lab: Lab, ttl: int) -> str:
    """An intruder's own lease (hex id, as etcdctl takes it)."""
    out = (await lab.etcdctl("lease", "grant", str(ttl))).stdout.decode()
    match = re.search(r"lease ([0-9a-f]+) granted", out)
    assert match, out
    return match.group(1)


class Intruder:
    """A wireguard-go device in pod 2 with a key of its own, that accepts rank 0 as a
    peer: a handshake or a packet rank 0 sends to it shows in its peer's counters."""

    def __init__(self, mesh: MeshLab) -> None:
        self.mesh = mesh
        self.pod = mesh.pod(2)
        self.process: LabProcess | None = None
        self.public_key = ""

    async def start(self, rank0_key: str) -> None:
        lab = self.mesh.lab
        self.process = await lab.start(self.pod, ["wireguard-go", "-f", "wgx"], WG_ENV)
        private = (await trio.run_process(["wg", "genkey"], capture_stdout=True)).stdout
        key_file = lab.workdir / "intruder.key"
        key_file.write_bytes(private)
        key_file.chmod(0o600)
        public = await trio.run_process(["wg", "pubkey"], stdin=private, capture_stdout=True)
        self.public_key = public.stdout.decode().strip()
        for _ in range(50):  # the device appears once wireguard-go is up
            up = await lab.run(self.pod, ["ip", "link", "show", "wgx"], 5, beside=self.process)
            if up.returncode == 0:
                break
            await trio.sleep(0.1)
        for argv in (
            ["wg", "set", "wgx", "private-key", str(key_file), "listen-port", "51820",
             "peer", rank0_key, "allowed-ips", f"{self.mesh.address(0)}/32"],
            ["ip", "address", "add", f"{self.mesh.address(1)}/32", "dev", "wgx"],
            ["ip", "link", "set", "wgx", "up"],
        ):  # fmt: skip
            result = await lab.run(self.pod, argv, 5, beside=self.process)
            assert result.returncode == 0, result.stderr.decode()

    async def received(self) -> int:
        """Bytes the intruder's device received from rank 0 (handshakes, packets)."""
        assert self.process is not None
        result = await self.mesh.lab.run(
            self.pod, ["wg", "show", "wgx", "transfer"], 5, beside=self.process
        )
        fields = result.stdout.decode().split()
        return int(fields[1]) if len(fields) >= 3 else 0


async def two_ranks(lab: Lab, *rank1_flags: str) -> MeshLab:
    """Every test's opening: ranks 0 and 1 started, the lab's probes, the pair formed."""
    mesh = MeshLab.create(lab, ttl=TTL)
    await mesh.start_rank(0)
    await mesh.start_rank(1, *rank1_flags)
    await mesh.start_probes()
    await form(mesh, {0, 1})
    return mesh


async def rank_1_in(lab: Lab, mesh: MeshLab, pod: Pod, pod_name: str) -> LabProcess:
    """A second daemon for rank 1, in ``pod``, named ``pod_name`` (its instance)."""
    argv = [sys.executable, "-m", "vnetd", "up", "--config", str(mesh.spec_path),
            "--rank", "1", "--state-dir", str(pod.state_dir)]  # fmt: skip
    return await lab.start(pod, argv, {"POD_IP": pod.underlay_ip, "POD_NAME": pod_name})


async def test_a_rewrite_from_public_data_never_moves_a_held_rank(lab: Lab) -> None:
    """Item 1: rank 1's record copied with the intruder's key and endpoint, the holder's
    instance kept, rewritten every 0.5 s. The /32 stays on the holder's key, nothing
    reaches the intruder, and rank 0 keeps reaching rank 1."""
    with trio.fail_after(120):
        mesh = await two_ranks(lab)
        real_key = await key_at(mesh, 0, 1)
        rank0_key = str((await record_of(mesh, 0))["public_key"])
        intruder = Intruder(mesh)
        await intruder.start(rank0_key)

        forged = await record_of(mesh, 1)
        forged.update(public_key=intruder.public_key, endpoint=f"{intruder.pod.underlay_ip}:51820")
        forged.pop("proof", None)  # it cannot be made without the holder's signing key
        seen: set[str | None] = set()
        for _ in range(16):  # 8 s: over one lease TTL, several of the holder's keepalives
            await lab.etcdctl("put", member_key(mesh.spec, 1), json.dumps(forged))
            await trio.sleep(0.5)
            seen.add(await key_at(mesh, 0, 1))
        assert seen == {real_key}, (seen, mesh.daemons[0].log_text()[-2000:])
        assert await intruder.received() == 0
        ping = await lab.run(mesh.pod(0), ["ping", "-c", "1", "-W", "2", mesh.address(1)], 5)
        assert ping.returncode == 0, ping.stdout.decode()
        log0 = mesh.daemons[0].log_text()
        assert "refusing a rewrite of rank 1's entry" in log0, log0[-2000:]
        # The holder notices its entry was overwritten and writes it back.
        with trio.fail_after(2 * TTL):
            while (await record_of(mesh, 1))["public_key"] != real_key:
                await trio.sleep(0.2)
        assert mesh.dead_daemons() == {}


def attacker_record(mesh: MeshLab, rank: int, intruder: Intruder) -> bytes:
    """A record for ``rank`` with the intruder's WireGuard key and endpoint, signed by an
    Ed25519 key of the attacker's own under lease 0: a valid proof, and no lease."""
    signer = Signer.generate()
    member = Member(rank, intruder.public_key, f"{intruder.pod.underlay_ip}:51820", "intruder",
                    1.0, "x", signing_key=signer.public_key, seq=time.time_ns())  # fmt: skip
    return encode_member(member, signer, key=member_key(mesh.spec, rank), lease=0)


async def sample_peer(mesh: MeshLab, on: int, rank: int, seconds: float) -> list[tuple[str, str]]:
    """(public key, endpoint) ``on``'s device holds ``rank``'s /32 on, every 0.2 s for
    ``seconds`` (("", "") while no peer holds it)."""
    samples: list[tuple[str, str]] = []
    with trio.move_on_after(seconds):
        while True:
            rows = await mesh.device_dump(on)
            row = next((r for r in rows if f"{mesh.address(rank)}/32" in r[3].split(",")), None)
            samples.append((row[0], row[2]) if row else ("", ""))
            await trio.sleep(0.2)
    return samples


async def test_a_leaseless_takeover_signed_by_the_attacker_routes_nothing_to_it(lab: Lab) -> None:
    """Issue 44, hole 1: rank 1's entry deleted and created at once with no lease, signed
    by the attacker's own Ed25519 key with the attacker's WireGuard key and endpoint.
    Rank 0 never routes rank 1's address to the attacker over two TTLs (sampled on its
    device), nothing reaches the attacker's device, the holder writes its record back
    and says what it found."""
    with trio.fail_after(120):
        mesh = await two_ranks(lab)
        real_key = await key_at(mesh, 0, 1)
        intruder = Intruder(mesh)
        await intruder.start(str((await record_of(mesh, 0))["public_key"]))
        forged = attacker_record(mesh, 1, intruder)
        # "At once": rank 1 cut off from etcd for the two writes, so that its claim never
        # comes between them (the attacker wins that race in practice; here, always).
        await cut_from_etcd(lab, mesh.pod(1))
        try:
            await lab.etcdctl("del", member_key(mesh.spec, 1))
            await lab.etcdctl("put", member_key(mesh.spec, 1), forged.decode())
        finally:
            await heal(lab, mesh.pod(1))
        samples = await sample_peer(mesh, 0, 1, 2 * TTL)
        assert intruder.public_key not in {key for key, _ in samples}, samples
        assert samples[-1][0] == real_key, samples[-5:]
        assert await intruder.received() == 0
        signing = json.loads(forged)["signing_key"]
        line = (f"claimed rank 1 as pod1 (took over a leaseless entry (instance intruder, "
                f"signing key {signing[:12]}, no lease), lease ")  # fmt: skip
        assert line in mesh.daemons[1].log_text(), mesh.daemons[1].log_text()[-2000:]
        assert "no lease: every claim is bound" in mesh.daemons[0].log_text()
        assert (await record_of(mesh, 1))["public_key"] == real_key
        ping = await lab.run(mesh.pod(0), ["ping", "-c", "1", "-W", "2", mesh.address(1)], 5)
        assert ping.returncode == 0, ping.stdout.decode()
        assert mesh.dead_daemons() == {}


async def test_with_auth_on_the_shared_mesh_credential_takes_no_rank_leaseless(
    tmp_path: Path,
) -> None:
    """Hole 1 with etcd auth on (TLS, client certificates, ``vnetd provision``'s mesh
    user): ranks 0 and 1 run as the mesh user, and the attacker, holding the same
    credential (``etcd_as.py`` from pod 2), deletes rank 1's entry and creates it with
    no lease, signed by its own key. etcd accepts both writes; no reader routes rank 1
    to the attacker, and the holder takes its entry back and says so."""
    root_password = tmp_path / "root.pw"
    root_password.write_text("root-secret\n")
    secrets = tmp_path / "secrets"
    secrets.mkdir(mode=0o700)
    with trio.fail_after(180):
        async with open_lab(3, with_etcd=False) as lab:
            tls, _ = await secured_lab(lab, tmp_path / "pki")
            mesh = MeshLab.create(lab, ttl=TTL)
            code, _, err = await vnetd_in(
                lab, mesh.pod(0), "provision", "--config", str(mesh.spec_path), "--etcd-user",
                "root", "--etcd-password-file", str(root_password), *tls_flags(tls),
                "--passwords", str(secrets))  # fmt: skip
            assert code == 0, err
            user = f"vnetd-{mesh.spec.name}"
            creds = ["--etcd-user", user, "--etcd-password-file", str(secrets / user),
                     *tls_flags(tls)]  # fmt: skip
            await mesh.start_rank(0, *creds)
            await mesh.start_rank(1, *creds)
            await mesh.start_probes()
            await form(mesh, {0, 1})
            real_key = await key_at(mesh, 0, 1)
            intruder = Intruder(mesh)
            await intruder.start(str((await record_of(mesh, 0))["public_key"]))
            forged = attacker_record(mesh, 1, intruder)
            key1 = member_key(mesh.spec, 1)
            await cut_from_etcd(lab, mesh.pod(1))
            try:
                answers = await as_user(lab, mesh.pod(2), tls, user, secrets / user,
                                        ["delete", key1], ["put", key1, forged.decode()])  # fmt: skip
            finally:
                await heal(lab, mesh.pod(1))
            assert [a["status"] for a in answers] == [200, 200], answers
            samples = await sample_peer(mesh, 0, 1, 2 * TTL)
            assert intruder.public_key not in {key for key, _ in samples}, samples
            assert samples[-1][0] == real_key, samples[-5:]
            assert await intruder.received() == 0
            log1 = mesh.daemons[1].log_text()
            assert "(took over a leaseless entry (instance intruder" in log1, log1[-2000:]
            assert mesh.dead_daemons() == {}


async def test_a_leaseless_record_at_a_free_rank_is_no_member_and_its_pod_takes_it(
    lab: Lab,
) -> None:
    """Hole 1 at a free rank, before its pod starts: nobody routes rank 1's address to
    the attacker, and rank 1's daemon, once started, takes the rank."""
    with trio.fail_after(120):
        mesh = MeshLab.create(lab, ttl=TTL)
        await wait_log(await mesh.start_rank(0), "claimed rank 0 ", 30)
        await mesh.start_probes()
        intruder = Intruder(mesh)
        await intruder.start(str((await record_of(mesh, 0))["public_key"]))
        await lab.etcdctl(
            "put", member_key(mesh.spec, 1), attacker_record(mesh, 1, intruder).decode()
        )
        samples = await sample_peer(mesh, 0, 1, TTL)
        assert set(samples) == {("", "")}, samples
        await mesh.start_rank(1)
        await form(mesh, {0, 1})
        assert await intruder.received() == 0
        assert (await key_at(mesh, 0, 1)) == (await record_of(mesh, 1))["public_key"]
        log1 = mesh.daemons[1].log_text()
        assert "(took over a leaseless entry (instance intruder" in log1, log1[-2000:]
        assert mesh.dead_daemons() == {}


async def lease_of_entry(mesh: MeshLab, rank: int) -> int:
    result = await mesh.lab.etcdctl("get", member_key(mesh.spec, rank), "-w", "json")
    return int(json.loads(result.stdout)["kvs"][0]["lease"])


async def refused_writes(lab: Lab, pod: Pod) -> float:
    """``vnetd_registry_refused_writes_total`` of the daemon in ``pod`` (``PORT``)."""
    _, metrics = await http_get(lab, pod, f"http://127.0.0.1:{PORT}/metrics")
    match = re.search(r"^vnetd_registry_refused_writes_total (\S+)$", metrics, re.M)
    assert match, metrics[-1500:]
    return float(match.group(1))


async def test_an_older_record_of_the_holder_put_back_under_its_lease_is_refused(
    lab: Lab,
) -> None:
    """Issue 44, hole 2: a record of rank 1's own signing key, older than its current one
    (an old endpoint and public key: here the intruder's), put back in place under
    rank 1's live lease. Its proof verifies, yet rank 0 keeps rank 1's current key and
    endpoint, counts the refusal, and the holder writes its record back and says so."""
    with trio.fail_after(120):
        mesh = MeshLab.create(lab, ttl=TTL)
        await mesh.start_rank(0, "--http-listen", f"127.0.0.1:{PORT}")
        await mesh.start_rank(1)
        await mesh.start_probes()
        await form(mesh, {0, 1})
        current = (await key_at(mesh, 0, 1), (await mesh.device_endpoints(0))[1])
        intruder = Intruder(mesh)
        await intruder.start(str((await record_of(mesh, 0))["public_key"]))
        key1, lease = member_key(mesh.spec, 1), await lease_of_entry(mesh, 1)
        now = await lab.etcdctl("get", "--print-value-only", key1)
        holder = decode_member(mesh.spec, key1, now.stdout.strip(), lease)
        old = replace(holder, public_key=intruder.public_key, seq=holder.seq - 10**9,
                      endpoint=f"{intruder.pod.underlay_ip}:51820")  # fmt: skip
        signer = load_signer(mesh.pod(1).state_dir / SIGNING_KEY_FILE)
        replay = encode_member(old, signer, key=key1, lease=lease)
        before = await refused_writes(lab, mesh.pod(0))
        await lab.etcdctl("put", "--lease", f"{lease:x}", key1, replay.decode())
        samples = await sample_peer(mesh, 0, 1, 2 * TTL)
        assert set(samples) == {current}, samples
        assert await intruder.received() == 0
        assert await refused_writes(lab, mesh.pod(0)) > before
        assert "a replay of an older record" in mesh.daemons[0].log_text()
        log1 = mesh.daemons[1].log_text()
        assert "rank 1's entry: found an older record of ours put back" in log1, log1[-2000:]
        assert json.loads((await lab.etcdctl("get", "--print-value-only", key1)).stdout)[
            "seq"] > holder.seq  # fmt: skip
        assert mesh.dead_daemons() == {}


GRANT_ID = """
import json, sys, urllib.request
url, lease = sys.argv[1], sys.argv[2]
body = json.dumps({"TTL": "60", "ID": lease}).encode()
request = urllib.request.Request(url + "/v3/lease/grant", body, {"Content-Type": "application/json"})
print(urllib.request.urlopen(request, timeout=10).read().decode())
"""


async def test_a_record_from_before_a_move_under_its_old_lease_granted_again_is_refused(
    lab: Lab,
) -> None:
    """Issue 44, hole 2: rank 1 (its signing key from a file, as a pinned gateway's) moves
    from pod 1 to pod 2. Its record from pod 1 is put back in place under its old lease
    ID, granted again by the attacker (etcd lets the client pick the ID). Rank 0 keeps
    rank 1's current endpoint, counts the refusal, and the new holder writes back."""
    with trio.fail_after(150):
        key_file = lab.workdir / "rank1-signing.key"
        create_signer_file(key_file, "test")
        mesh = MeshLab.create(lab, ttl=TTL)
        await mesh.start_rank(0, "--http-listen", f"127.0.0.1:{PORT}")
        await mesh.start_rank(1, "--signing-key-file", str(key_file))
        await mesh.start_probes()
        await form(mesh, {0, 1})
        key1, old_lease = member_key(mesh.spec, 1), await lease_of_entry(mesh, 1)
        old = (await lab.etcdctl("get", "--print-value-only", key1)).stdout.strip()
        assert await mesh.daemons[1].stop() == 0  # SIGTERM: its lease is revoked
        pod = mesh.pod(2)
        argv = [sys.executable, "-m", "vnetd", "up", "--config", str(mesh.spec_path), "--rank",
                "1", "--state-dir", str(pod.state_dir), "--signing-key-file", str(key_file)]  # fmt: skip
        moved = await lab.start(pod, argv, {"POD_IP": pod.underlay_ip, "POD_NAME": pod.name})
        await wait_log(moved, "claimed rank 1 ", 30)
        with trio.fail_after(2 * TTL):
            while (await mesh.device_endpoints(0)).get(1) != f"{pod.underlay_ip}:51820":
                await trio.sleep(0.2)
        current = (await key_at(mesh, 0, 1), f"{pod.underlay_ip}:51820")
        granted = await lab.run(mesh.pod(0), [sys.executable, "-c", GRANT_ID, lab.etcd_url,
                                              str(old_lease)], 15)  # fmt: skip
        assert granted.returncode == 0 and str(old_lease) in granted.stdout.decode(), granted
        before = await refused_writes(lab, mesh.pod(0))
        await lab.etcdctl("put", "--lease", f"{old_lease:x}", key1, old.decode())
        samples = await sample_peer(mesh, 0, 1, 2 * TTL)
        assert set(samples) == {current}, samples
        assert await refused_writes(lab, mesh.pod(0)) > before
        assert "rank 1's entry: found an older record of ours put back" in moved.log_text()
        assert mesh.dead_daemons() == {1: 0}  # the one stopped on purpose
        assert moved.returncode is None


async def test_a_copy_of_a_key_at_a_free_rank_does_not_knock_its_member_out(lab: Lab) -> None:
    """Item 2: rank 1's public key registered at free rank 2 (under the intruder's own
    lease), then rank 1's entry deleted. Rank 0 still reaches rank 1 once rank 1 has
    claimed again, and rank 1 reports the copy of its key."""
    with trio.fail_after(120):
        mesh = await two_ranks(lab)
        copy = await record_of(mesh, 1)
        copy.update(rank=2, instance="intruder", endpoint=f"{mesh.pod(2).underlay_ip}:51820")
        copy.pop("proof", None)
        copy.pop("signing_key", None)
        lease = await grant_lease(lab, 120)
        await lab.etcdctl("put", "--lease", lease, member_key(mesh.spec, 2), json.dumps(copy))
        await trio.sleep(1.0)  # the copy reaches every watch before the delete
        await lab.etcdctl("del", member_key(mesh.spec, 1))
        with trio.fail_after(2 * TTL):
            while True:
                ping = await lab.run(
                    mesh.pod(0), ["ping", "-c", "1", "-W", "1", mesh.address(1)], 5
                )
                if ping.returncode == 0:
                    break
                await trio.sleep(0.2)
        assert await key_at(mesh, 0, 2) is None
        log1 = mesh.daemons[1].log_text()
        assert "rank 2's entry carries our public key" in log1, log1[-2000:]


async def test_a_rank_cut_off_and_replaced_is_no_longer_ready(lab: Lab) -> None:
    """Item 3: rank 1 cut off from etcd for two TTLs, another pod claims rank 1, the cut
    heals: the old daemon answers /readyz 503 and its /status says it waits."""
    with trio.fail_after(120):
        mesh = await two_ranks(lab, "--http-listen", f"127.0.0.1:{PORT}")
        ready = f"http://127.0.0.1:{PORT}/readyz"
        assert (await http_get(lab, mesh.pod(1), ready))[0] == 200
        for rule in (
            ["add", "table", "inet", "vnetd_cut"],
            ["add", "chain", "inet", "vnetd_cut", "out",
             "{ type filter hook output priority 0 ; }"],
            ["add", "rule", "inet", "vnetd_cut", "out",
             "ip", "daddr", ETCD_IP, "tcp", "dport", str(ETCD_PORT), "drop"],
        ):  # fmt: skip
            nft = await lab.run(mesh.pod(1), ["nft", *rule], 5)
            assert nft.returncode == 0, nft.stderr.decode()
        await trio.sleep(2 * TTL)
        pod = mesh.pod(2)
        replacement = await rank_1_in(lab, mesh, pod, pod.name)
        await wait_log(replacement, "claimed rank 1 ", 30)
        healed = await lab.run(mesh.pod(1), ["nft", "delete", "table", "inet", "vnetd_cut"], 5)
        assert healed.returncode == 0, healed.stderr.decode()
        with trio.fail_after(2 * TTL):
            while (await http_get(lab, mesh.pod(1), ready))[0] != 503:
                await trio.sleep(0.2)
        status, body = await http_get(lab, mesh.pod(1), f"http://127.0.0.1:{PORT}/status")
        assert status == 200
        me = json.loads(body)["self"]
        assert me["claimed"] is False and me["claim"] == "waiting", me
        assert me["holder"] == pod.name, me


async def test_two_daemons_with_one_instance_settle(lab: Lab) -> None:
    """Item 5: a second daemon for rank 1 under the same instance (a cloned host, a
    force-deleted pod's successor) starts beside the first. Over three TTLs rank 0's
    device changes rank 1's key at most once, and exactly one daemon waits."""
    with trio.fail_after(120):
        mesh = await two_ranks(lab)
        pod = mesh.pod(2)
        twin = await rank_1_in(lab, mesh, pod, mesh.pod(1).name)
        keys: list[str | None] = [await key_at(mesh, 0, 1)]
        with trio.move_on_after(3 * TTL):
            while True:
                key = await key_at(mesh, 0, 1)
                if key != keys[-1]:
                    keys.append(key)
                await trio.sleep(0.2)
        assert len(keys) <= 2, keys
        waiting = [p for p in (mesh.daemons[1], twin) if "rank 1 is held by" in p.log_text()]
        assert len(waiting) == 1, [p.log_text()[-1500:] for p in (mesh.daemons[1], twin)]
        assert mesh.dead_daemons() == {} and twin.returncode is None


async def cut_from_etcd(lab: Lab, pod: Pod) -> None:
    """Drop ``pod``'s packets to etcd's client port (its connections stall, not reset)."""
    for rule in (
        ["add", "table", "inet", "vnetd_cut"],
        ["add", "chain", "inet", "vnetd_cut", "out", "{ type filter hook output priority 0 ; }"],
        ["add", "rule", "inet", "vnetd_cut", "out",
         "ip", "daddr", ETCD_IP, "tcp", "dport", str(ETCD_PORT), "drop"],
    ):  # fmt: skip
        nft = await lab.run(pod, ["nft", *rule], 5)
        assert nft.returncode == 0, nft.stderr.decode()


async def heal(lab: Lab, pod: Pod) -> None:
    healed = await lab.run(pod, ["nft", "delete", "table", "inet", "vnetd_cut"], 5)
    assert healed.returncode == 0, healed.stderr.decode()


DISPLACE_TTL = 10
"""Long enough that rank 1's lease outlives the few seconds it is cut off (a
keepalive is due every TTL/3): the displacement happens while its lease lives."""


async def test_a_holder_displaced_under_a_live_lease_says_so_and_comes_back(lab: Lab) -> None:
    """Delete + create under the intruder's own live lease, while rank 1's lease lives
    (rank 1 cut off from etcd for the two writes, so it cannot claim between them):
    peers take the new registration (detected, not refused: docs/security.md), and rank
    1 reports itself displaced in its log, ``/readyz`` (503), ``/status`` and
    ``vnetd_claim_displaced_total``. Once the intruder's lease is revoked rank 1 claims
    again, is ready, and rank 0 routes rank 1 to its key again."""
    with trio.fail_after(150):
        mesh = MeshLab.create(lab, ttl=DISPLACE_TTL)
        await mesh.start_rank(0)
        await mesh.start_rank(1, "--http-listen", f"127.0.0.1:{PORT}")
        await mesh.start_probes()
        await form(mesh, {0, 1})
        base = f"http://127.0.0.1:{PORT}"
        assert (await http_get(lab, mesh.pod(1), f"{base}/readyz"))[0] == 200
        real_key = await key_at(mesh, 0, 1)
        intruder = Intruder(mesh)
        await intruder.start(str((await record_of(mesh, 0))["public_key"]))
        forged = await record_of(mesh, 1)
        forged.update(public_key=intruder.public_key, instance="intruder",
                      endpoint=f"{intruder.pod.underlay_ip}:51820")  # fmt: skip
        forged.pop("proof", None)
        forged.pop("signing_key", None)
        lease = await grant_lease(lab, 120)

        await cut_from_etcd(lab, mesh.pod(1))
        try:
            await lab.etcdctl("del", member_key(mesh.spec, 1))
            await lab.etcdctl("put", "--lease", lease, member_key(mesh.spec, 1), json.dumps(forged))
        finally:
            await heal(lab, mesh.pod(1))
        # Not ready at once (its entry is gone); displaced once it has seen who holds it.
        answers: list[tuple[int, str]] = []
        with trio.move_on_after(DISPLACE_TTL):
            while (
                "displaced" not in (answer := await http_get(lab, mesh.pod(1), f"{base}/readyz"))[1]
            ):
                answers.append(answer)
                await trio.sleep(0.2)
        assert answer[0] == 503, (answer, answers[-3:])
        assert "not ready: displaced: rank 1 was taken by intruder" in answer[1], answer
        # /status and /metrics are built at most once a second: the next build has it.
        with trio.fail_after(5):
            while True:
                me = json.loads((await http_get(lab, mesh.pod(1), f"{base}/status"))[1])["self"]
                metrics = (await http_get(lab, mesh.pod(1), f"{base}/metrics"))[1]
                if me["claim"] == "displaced" and "vnetd_claim_displaced_total 1.0" in metrics:
                    break
                await trio.sleep(0.3)
        assert (me["holder"], me["claimed"]) == ("intruder", False), me
        log1 = mesh.daemons[1].log_text()
        assert re.search(r"rank 1 was taken by intruder \(lease [0-9a-f]+\) while our lease "
                         r"[0-9a-f]+ lived: displaced", log1), log1[-2000:]  # fmt: skip
        assert await key_at(mesh, 0, 1) == intruder.public_key  # what a delete allows

        await lab.etcdctl("lease", "revoke", lease)
        with trio.fail_after(2 * DISPLACE_TTL):
            while (await http_get(lab, mesh.pod(1), f"{base}/readyz"))[0] != 200:
                await trio.sleep(0.2)
        with trio.fail_after(DISPLACE_TTL):
            while await key_at(mesh, 0, 1) != real_key:
                await trio.sleep(0.2)
        ping = await lab.run(mesh.pod(0), ["ping", "-c", "1", "-W", "2", mesh.address(1)], 5)
        assert ping.returncode == 0, ping.stdout.decode()
        assert mesh.dead_daemons() == {}


async def test_a_dead_holder_s_lease_kept_alive_is_reported_and_its_replacement_waits(
    lab: Lab,
) -> None:
    """Issue 44, fourth bullet: rank 1's daemon and its wireguard-go get SIGKILL (no
    revoke) while the test, as an attacker would, keeps the rank's lease alive with
    etcd's keepalive. A new daemon for rank 1 (another instance) waits and reports the
    entry (log, /status ``self.held_by``, metric); ``vnetd doctor`` names
    ``held_silent``, ``vnetd status`` beside the new daemon shows the old instance at
    rank 1 and notes its device registered at no rank. Reported only: once the keeper
    stops, the lease ends and the new daemon claims (docs/security.md)."""
    with trio.fail_after(180):
        mesh = await two_ranks(lab)
        old, lease = mesh.pod(1).name, await lease_of_entry(mesh, 1)
        wg_pid = mesh.wireguard_go_pid(1)
        mesh.daemons[1].kill()
        signal_pid(wg_pid, signal.SIGKILL)  # the pod is gone: its device with it
        assert await mesh.daemons[1].wait(5) == -signal.SIGKILL
        keeper = trio.CancelScope()

        async def keep_alive() -> None:
            with keeper:
                while True:  # ends with the scope: cancelled below, or by fail_after
                    await lab.etcdctl("lease", "keep-alive", "--once", f"{lease:x}")
                    await trio.sleep(1.0)  # TTL is 5 s

        async with trio.open_nursery() as nursery:
            nursery.start_soon(keep_alive)
            pod = mesh.pod(2)
            argv = [sys.executable, "-m", "vnetd", "up", "--config", str(mesh.spec_path),
                    "--rank", "1", "--state-dir", str(pod.state_dir),
                    "--http-listen", f"127.0.0.1:{PORT}"]  # fmt: skip
            new = await lab.start(pod, argv, {"POD_IP": pod.underlay_ip, "POD_NAME": pod.name})
            await wait_log(new, f"rank 1 is held by {old}; waiting for its lease to end", 30)
            await trio.sleep(3 * TTL)  # the kept-alive lease outlives three TTLs
            assert "claimed rank 1 " not in new.log_text()
            assert new.log_text().count("rank 1 is held by") == 1, "logged once"
            status, body = await http_get(lab, pod, f"http://127.0.0.1:{PORT}/status")
            assert status == 200
            me = json.loads(body)["self"]
            held = me["held_by"]
            assert me["claim"] == "waiting" and held is not None, me
            assert (held["instance"], held["lease"]) == (old, f"{lease:x}"), held
            assert held["held_for_s"] >= 3 * TTL, held
            _, metrics = await http_get(lab, pod, f"http://127.0.0.1:{PORT}/metrics")
            assert re.search(rf'^vnetd_claim_held_seconds\{{instance="{old}",'
                             rf'lease="{lease:x}",signing_key="[^"]+"\}} ', metrics, re.M)  # fmt: skip

            doctor = await lab.run(mesh.pod(0), [sys.executable, "-m", "vnetd", "doctor",
                                   "--config", str(mesh.spec_path), "--json", "--timeout",
                                   "30"], 45)  # fmt: skip
            print(doctor.stderr.decode()[-2000:])
            report = json.loads(doctor.stdout)
            text = json.dumps(report)
            assert '"held_silent"' in text, text[:3000]
            assert f"rank 1's entry (instance '{old}'" in text, text[:3000]

            shown = await lab.run(pod, [sys.executable, "-m", "vnetd", "status", "--config",
                                  str(mesh.spec_path)], 30, beside=new)  # fmt: skip
            table = shown.stdout.decode()
            print(table)
            assert shown.returncode == 0, shown.stderr.decode()
            assert "this device is registered at no rank" in table
            row1 = next(line for line in table.splitlines() if line.split()[:1] == ["1"])
            assert old in row1 and "registered" in row1, row1

            keeper.cancel()  # reported, never acted on: the lease's end frees the rank
            await wait_log(new, "claimed rank 1 ", 3 * TTL)
        assert mesh.dead_daemons() == {1: -signal.SIGKILL}
        assert new.returncode is None
