"""A relay that changes one member's record before serving it, for the trust test.

``python forging_relay.py ETCD_URL PREFIX LISTEN KEY MODE``: relays ``PREFIX`` of etcd on
``LISTEN`` as ``vnetd relay`` does, but serves the record at ``KEY`` ``forged`` (its
endpoint moved, its proof kept) or ``truncated`` (its first half). Test tooling only.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from dataclasses import replace

import trio

from vnetd.registry.base import KeyValue, WatchEvent
from vnetd.registry.etcd.client import open_etcd_registry
from vnetd.registry.relay.app import Changes, RelayApp, serve_relay
from vnetd.registry.relay.cache import MemberCache
from vnetd.registry.relay.upstream import StoreRevision, follow

FORGED_ENDPOINT = "198.18.9.9:51820"


class TamperingCache(MemberCache):
    def __init__(self, prefix: str, key: str, mode: str) -> None:
        super().__init__(prefix)
        self.key, self.mode = key, mode

    def tampered(self, value: bytes) -> bytes:
        if self.mode == "truncated":
            return value[: len(value) // 2]
        record = json.loads(value)
        record["endpoint"] = FORGED_ENDPOINT
        return json.dumps(record).encode()

    def replace(self, kvs: Iterable[KeyValue], revision: int) -> None:
        changed = [
            replace(kv, value=self.tampered(kv.value)) if kv.key == self.key else kv for kv in kvs
        ]
        super().replace(changed, revision)

    def apply(self, batch: Iterable[WatchEvent]) -> int:
        changed = [
            replace(e, value=self.tampered(e.value)) if e.key == self.key and e.kind == "put" else e
            for e in batch
        ]
        return super().apply(changed)


async def main(etcd: str, prefix: str, listen: str, key: str, mode: str) -> None:
    async with open_etcd_registry([etcd]) as registry, trio.open_nursery() as nursery:
        cache = TamperingCache(prefix, key, mode)
        changes = Changes()
        app = RelayApp(cache, changes, StoreRevision(registry, prefix))
        await nursery.start(follow, registry, cache, changes)
        await nursery.start(serve_relay, [listen], app)
        print(f"forging relay ({mode} {key}) serving at {listen}", flush=True)


if __name__ == "__main__":
    trio.run(main, *sys.argv[1:6])
