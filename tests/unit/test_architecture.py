"""The import rule of docs/architecture.md's module map, checked on the source.

The pure core imports no I/O library; a backend is imported only inside its
port package (everyone else opens it through the port); the adapters know no mesh logic; the module-level import graph
has no cycles.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[2] / "vnetd"

IO_LIBRARIES = {"trio", "httpx", "pyroute2", "cryptography", "hypercorn", "prometheus_client"}

PURE_CORE = {
    "vnetd.config",
    "vnetd.dataplane.uapi_protocol",
    "vnetd.plan",
    "vnetd.errors",
    "vnetd.gateways",
    "vnetd.initiator",
    "vnetd.mesh",
    "vnetd.model",
    "vnetd.ranks",
    "vnetd.render.flux",
    "vnetd.render.hostfile",
    "vnetd.render.hosts",
    "vnetd.render.keyfile",
    "vnetd.render.manifests",
    "vnetd.render.minicluster",
    "vnetd.render.monitoring",
    "vnetd.render.pods",
    "vnetd.render.podscripts",
    "vnetd.render.output",
    "vnetd.render.wgquick",
    "vnetd.spec",
    "vnetd.spec.parse",
    "vnetd.spec.records",
    "vnetd.status.table",
    "vnetd.status.view",
    "vnetd.wait.gate",
}

PORTS = ("vnetd.registry", "vnetd.dataplane")

BACKENDS = {
    "vnetd.registry.etcd",
    "vnetd.registry.etcd_auth",
    "vnetd.registry.etcd_endpoints",
    "vnetd.registry.etcd_gateway",
    "vnetd.registry.etcd_pages",
    "vnetd.registry.etcd_security",
    "vnetd.registry.etcd_watch",
    "vnetd.registry.memory",
    "vnetd.dataplane.fake",
    "vnetd.dataplane.kernel",
    "vnetd.dataplane.supervise",
    "vnetd.dataplane.uapi",
    "vnetd.dataplane.uapi_client",
}
"""Imported only inside their port package: everyone else opens them through the port
(``open_registry``, ``choose_dataplane`` / ``open_dataplane``)."""

MESH_LOGIC = ("vnetd.mesh", "vnetd.control", "vnetd.reconciler", "vnetd.daemon")
"""What the adapters (the port packages) must not import."""

EXEMPT = ("vnetd.lab",)
"""The netns lab is test and demo tooling: it drives every part from outside."""


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, ast.Module]:
    return {module_name(p): ast.parse(p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))}


def imports(tree: ast.AST, *, top_level_only: bool = False) -> Iterator[str]:
    """Every module name imported in ``tree`` (lazy imports too, unless top_level_only)."""
    nodes = tree.body if top_level_only and isinstance(tree, ast.Module) else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


SOURCES = modules()


def test_the_pure_core_exists() -> None:
    assert PURE_CORE <= SOURCES.keys()


@pytest.mark.parametrize("name", sorted(PURE_CORE & SOURCES.keys()))
def test_pure_core_imports_no_io_library(name: str) -> None:
    used = {imported.split(".")[0] for imported in imports(SOURCES[name])}
    assert used & IO_LIBRARIES == set()


def test_every_backend_exists() -> None:
    assert BACKENDS <= SOURCES.keys()


@pytest.mark.parametrize(
    "name", sorted(n for n in SOURCES if not any(within(n, p) for p in (*PORTS, *EXEMPT)))
)
def test_backends_are_opened_through_their_port(name: str) -> None:
    used = {b for b in BACKENDS for i in imports(SOURCES[name]) if within(i, b)}
    assert used == set()


@pytest.mark.parametrize("name", sorted(n for n in SOURCES if any(within(n, p) for p in PORTS)))
def test_adapters_know_no_mesh_logic(name: str) -> None:
    used = {i for i in imports(SOURCES[name]) if any(within(i, m) for m in MESH_LOGIC)}
    assert used == set()


def test_module_level_imports_have_no_cycle() -> None:
    graph = {
        name: {
            i
            for i in imports(tree, top_level_only=True)
            if i in SOURCES and i != name and not within(name, i)
        }
        for name, tree in SOURCES.items()
    }
    cycle = _find_cycle(graph)
    assert cycle == []


def _find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of ``graph`` as a list of names, or [] when it has none."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []
