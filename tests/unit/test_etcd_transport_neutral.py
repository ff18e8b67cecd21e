"""The parts of the etcd backend written for any transport load neither the JSON
gateway's codec nor httpx (docs/architecture.md, "etcd transport"): a second transport
(native gRPC, say) reuses them by implementing ``registry.etcd.transport``. Each check
runs in a fresh interpreter, so what the modules' packages import counts too; a lazy
import is found in the source."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

NEUTRAL = (
    "vnetd.registry.etcd.transport",
    "vnetd.registry.etcd.pages",
    "vnetd.registry.etcd.auth",
    "vnetd.registry.etcd.endpoints",
)
GATEWAY_ONLY = ("vnetd.registry.etcd.gateway", "httpx", "httpcore")


@pytest.mark.parametrize("name", NEUTRAL)
def test_a_transport_neutral_module_loads_no_gateway(name: str) -> None:
    code = f"import sys, {name}; print(' '.join(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    loaded = set(result.stdout.split())
    assert name in loaded
    assert sorted(loaded & set(GATEWAY_ONLY)) == []


@pytest.mark.parametrize("name", NEUTRAL)
def test_a_transport_neutral_module_names_no_gateway_module_even_lazily(name: str) -> None:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text())
    named = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            named |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            named |= {base, *(f"{base}.{alias.name}" for alias in node.names)}
    gateway_side = {"gateway", "client", "tokens", "security", "watch", "httpcore_package"}
    found = sorted(
        n for n in named
        if n.split(".")[0] in {"httpx", "httpcore"} or n.rsplit(".", 1)[-1] in gateway_side
    )  # fmt: skip
    assert found == []
