"""etcd full (NOSPACE), as docs/operations.md "etcd full" says, against real etcd 3.4 in
the lab with a small quota (the manifests' 512 MiB holds a few MiB the same way).

One writer rewriting one key with 1 MiB values fills the quota from history alone.
Then, through the JSON gateway vnetd speaks: a put and a lease grant are refused with
code 8 (HTTP 429), while a keepalive keeps an existing lease (and the key on it) alive
past its TTL, and a range and a delete pass; the NOSPACE alarm is raised. The
documented recovery, in its order: after compaction and after defragmentation a put is
still refused; after ``alarm disarm`` it passes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import trio

from vnetd.lab.etcd import ETCD_BIN, ETCDCTL_BIN
from vnetd.lab.open_lab import open_lab

QUOTA = 16 * 1024 * 1024
LEASE_TTL = 3
"""The lease kept alive through the alarm: the test outlives it twice over."""
READY = 20.0
"""etcd answers within a second or two here; one that does not within this is broken."""
RESOURCE_EXHAUSTED = 8

CLIENT = """
import base64, json, sys, time, httpx
url, step = sys.argv[1], sys.argv[2]
b64 = lambda s: base64.b64encode(s.encode() if isinstance(s, str) else s).decode()
c = httpx.Client(timeout=10)
def call(path, body):
    r = c.post(url + path, json=body)
    data = r.json()
    return {"status": r.status_code, "code": data.get("code"), "data": data}
out = {}
if step == "fill":
    out["grant"] = call("/v3/lease/grant", {"TTL": LEASE_TTL})
    lease = out["grant"]["data"]["ID"]
    out["held"] = call("/v3/kv/put", {"key": b64("/held"), "value": b64("x"), "lease": lease})
    big, writes, start = b64(b"x" * (1024 * 1024)), 0, time.monotonic()
    while writes < 200:
        answer = call("/v3/kv/put", {"key": b64("/junk"), "value": big})
        if answer["status"] != 200:
            out["full"] = answer
            break
        writes += 1
    out["writes"], out["seconds"] = writes, time.monotonic() - start
    out["lease"] = lease
elif step == "during":
    lease = sys.argv[3]
    out["put"] = call("/v3/kv/put", {"key": b64("/small"), "value": b64("v")})
    out["grant"] = call("/v3/lease/grant", {"TTL": 5})
    for _ in range(LEASE_TTL * 2 * 2):  # keepalives every half second, for two TTLs
        out["keepalive"] = call("/v3/lease/keepalive", {"ID": lease})
        time.sleep(0.5)
    out["held"] = call("/v3/kv/range", {"key": b64("/held")})
    out["delete"] = call("/v3/kv/deleterange", {"key": b64("/junk")})
    out["alarms"] = call("/v3/maintenance/alarm", {"action": "GET"})
else:
    out["put"] = call("/v3/kv/put", {"key": b64("/small"), "value": b64("v")})
print(json.dumps(out))
""".replace("LEASE_TTL", str(LEASE_TTL))


async def test_nospace_refuses_writes_and_grants_keeps_renewals_and_recovers_as_documented(
    tmp_path: Path,
) -> None:
    async with open_lab(2, with_etcd=False) as lab:
        server, client = lab.pods
        url = f"http://{server.underlay_ip}:2379"
        await lab.start(server, [
            ETCD_BIN, "--name", "full", "--data-dir", str(tmp_path / "data"),
            "--listen-client-urls", url, "--advertise-client-urls", url,
            "--listen-peer-urls", "http://127.0.0.1:2380",
            f"--quota-backend-bytes={QUOTA}",
        ], private_mount=False)  # fmt: skip
        etcdctl = [ETCDCTL_BIN, "--endpoints", url, "--dial-timeout=2s", "--command-timeout=20s"]

        async def ctl(*args: str) -> str:
            result = await lab.run(server, [*etcdctl, *args], 30)
            assert result.returncode == 0, (args, result.stderr.decode())
            return result.stdout.decode()

        async def step(*args: str) -> dict[str, dict[str, object]]:
            result = await lab.run(client, [sys.executable, "-c", CLIENT, url, *args], 60)
            assert result.returncode == 0, result.stderr.decode()
            answers: dict[str, dict[str, object]] = json.loads(result.stdout)
            return answers

        with trio.fail_after(READY):
            while (await lab.run(server, [*etcdctl, "endpoint", "health"])).returncode:
                await trio.sleep(0.2)

        filled = await step("fill")
        print(f"{filled['writes']} writes of 1 MiB to one key filled a {QUOTA >> 20} MiB quota "
              f"in {float(filled['seconds']):.1f} s")  # fmt: skip
        assert filled["full"]["code"] == RESOURCE_EXHAUSTED, filled["full"]
        assert "database space exceeded" in json.dumps(filled["full"])

        during = await step("during", str(filled["lease"]))
        for refused in ("put", "grant"):
            assert (during[refused]["status"], during[refused]["code"]) == (
                429, RESOURCE_EXHAUSTED), (refused, during[refused])  # fmt: skip
        assert during["keepalive"]["status"] == 200, during["keepalive"]
        assert int(during["keepalive"]["data"]["result"]["TTL"]) > 0, "the lease expired"
        assert during["held"]["data"].get("kvs"), "the key on the kept lease is gone"
        assert during["delete"]["status"] == 200, during["delete"]
        assert "NOSPACE" in json.dumps(during["alarms"]), during["alarms"]

        # docs/operations.md's recovery, in its order.
        status = json.loads(await ctl("endpoint", "status", "-w", "json"))
        await ctl("compact", str(status[0]["Status"]["header"]["revision"]))
        assert (await step("after"))["put"]["status"] == 429, "compaction alone recovers"
        await ctl("defrag")
        size = json.loads(await ctl("endpoint", "status", "-w", "json"))[0]["Status"]["dbSize"]
        assert (await step("after"))["put"]["status"] == 429, "defragmentation alone recovers"
        await ctl("alarm", "disarm")
        assert (await step("after"))["put"]["status"] == 200
        assert "NOSPACE" not in await ctl("alarm", "list")
        print(f"after compact and defrag: {size} bytes; a put passes once disarmed")
