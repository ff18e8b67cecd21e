"""The layer table of docs/architecture.md's module map, checked on the source and the doc.

``LAYER_OF`` names every module of ``vnetd/`` and its layer; ``MAY_IMPORT``
says which layers a layer's modules may reach. Both are checked on the import
*closure* (lazy imports included), so "pure" means pure and "adapters know no
mesh logic" holds one step removed as well as directly. The library rules the
doc states are checked on direct imports; the module-level import graph has no
cycle; a backend is imported only inside its port package. The doc's map has
one row per layer, in this order, naming the same modules and the same layers.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[2] / "vnetd"
DOC = PACKAGE.parent / "docs" / "architecture.md"

CORE = "core"
TOPOLOGY = "topology"
VIEWS = "views"
LEAVES = "leaves"
SETTINGS = "settings"
REGISTRY = "registry port"
DATAPLANE = "dataplane port"
CONTROL = "control"
OBSERVE = "observe"
DAEMON = "daemon"
COMMANDS = "commands"
LAB = "lab"

PURE = (CORE, TOPOLOGY, VIEWS)
"""Layers whose closure imports no I/O library."""

IO_LIBRARIES = {"trio", "httpx", "pyroute2", "cryptography", "hypercorn", "prometheus_client"}

MAY_IMPORT: dict[str, set[str]] = {
    CORE: {CORE},
    TOPOLOGY: {CORE, TOPOLOGY},
    VIEWS: {CORE, TOPOLOGY, VIEWS},
    LEAVES: {CORE, LEAVES},
    SETTINGS: {CORE, LEAVES, SETTINGS},
    REGISTRY: {CORE, REGISTRY},
    DATAPLANE: {CORE, LEAVES, DATAPLANE},
    CONTROL: {CORE, LEAVES, REGISTRY, CONTROL},
    OBSERVE: {CORE, TOPOLOGY, VIEWS, LEAVES, DATAPLANE, REGISTRY, CONTROL, OBSERVE},
    DAEMON: {
        CORE, TOPOLOGY, VIEWS, LEAVES, SETTINGS, REGISTRY, DATAPLANE, CONTROL, OBSERVE, DAEMON
    },
    COMMANDS: {
        CORE, TOPOLOGY, VIEWS, LEAVES, SETTINGS, REGISTRY, DATAPLANE, CONTROL, OBSERVE, DAEMON,
        COMMANDS, LAB,
    },
    LAB: {CORE, LEAVES, REGISTRY, CONTROL, LAB},
}  # fmt: skip
"""The layers a layer's modules may reach, directly or through others."""

LAYER_OF: dict[str, str] = {
    "vnetd": CORE,
    "vnetd.dataplane": CORE,
    "vnetd.dataplane.base": CORE,
    "vnetd.dataplane.codec": CORE,
    "vnetd.dataplane.codec.netlink_wire": CORE,
    "vnetd.dataplane.codec.rtnetlink_wire": CORE,
    "vnetd.dataplane.codec.uapi_protocol": CORE,
    "vnetd.dataplane.kernel": CORE,
    "vnetd.dataplane.rtnetlink": CORE,
    "vnetd.dataplane.wireguard_go": CORE,
    "vnetd.errors": CORE,
    "vnetd.model": CORE,
    "vnetd.ranks": CORE,
    "vnetd.pacing": CORE,
    "vnetd.spec": CORE,
    "vnetd.spec.parse": CORE,
    "vnetd.spec.records": CORE,
    "vnetd.mesh": TOPOLOGY,
    "vnetd.mesh.gateways": TOPOLOGY,
    "vnetd.mesh.initiator": TOPOLOGY,
    "vnetd.mesh.peers": TOPOLOGY,
    "vnetd.render": VIEWS,
    "vnetd.render.flux": VIEWS,
    "vnetd.render.hostfile": VIEWS,
    "vnetd.render.hosts": VIEWS,
    "vnetd.render.manifests": VIEWS,
    "vnetd.render.minicluster": VIEWS,
    "vnetd.render.monitoring": VIEWS,
    "vnetd.render.output": VIEWS,
    "vnetd.render.pods": VIEWS,
    "vnetd.render.podscripts": VIEWS,
    "vnetd.render.secretfiles": VIEWS,
    "vnetd.render.site_manifests": VIEWS,
    "vnetd.render.wgquick": VIEWS,
    "vnetd.status": VIEWS,
    "vnetd.status.table": VIEWS,
    "vnetd.status.view": VIEWS,
    "vnetd.wait": VIEWS,
    "vnetd.wait.gate": VIEWS,
    "vnetd.doctor": VIEWS,
    "vnetd.doctor.cause": VIEWS,
    "vnetd.doctor.evidence": VIEWS,
    "vnetd.doctor.report": VIEWS,
    "vnetd.keys": LEAVES,
    "vnetd.logs": LEAVES,
    "vnetd.gc_pause": LEAVES,
    "vnetd.config": SETTINGS,
    "vnetd.identity": SETTINGS,
    "vnetd.registry": REGISTRY,
    "vnetd.registry.access_base": REGISTRY,
    "vnetd.registry.base": REGISTRY,
    "vnetd.registry.bounds": REGISTRY,
    "vnetd.registry.etcd": REGISTRY,
    "vnetd.registry.etcd_auth": REGISTRY,
    "vnetd.registry.httpcore_package": REGISTRY,
    "vnetd.registry.etcd_endpoints": REGISTRY,
    "vnetd.registry.etcd_pages": REGISTRY,
    "vnetd.registry.etcd_gateway": REGISTRY,
    "vnetd.registry.etcd_security": REGISTRY,
    "vnetd.registry.etcd_watch": REGISTRY,
    "vnetd.registry.memory": REGISTRY,
    "vnetd.registry.opener": REGISTRY,
    "vnetd.dataplane.select": DATAPLANE,
    "vnetd.dataplane.device_reader": DATAPLANE,
    "vnetd.dataplane.fake": DATAPLANE,
    "vnetd.dataplane.wireguard_go.device": DATAPLANE,
    "vnetd.dataplane.wireguard_go.supervise": DATAPLANE,
    "vnetd.dataplane.wireguard_go.uapi_client": DATAPLANE,
    "vnetd.dataplane.kernel.device": DATAPLANE,
    "vnetd.dataplane.kernel.wg_netlink": DATAPLANE,
    "vnetd.dataplane.rtnetlink.fail_closed": DATAPLANE,
    "vnetd.dataplane.rtnetlink.link": DATAPLANE,
    "vnetd.dataplane.rtnetlink.link_reads": DATAPLANE,
    "vnetd.dataplane.rtnetlink.link_socket": DATAPLANE,
    "vnetd.dataplane.rtnetlink.linked_device": DATAPLANE,
    "vnetd.dataplane.rtnetlink.pyroute2_package": DATAPLANE,
    "vnetd.dataplane.rtnetlink.route_mtu": DATAPLANE,
    "vnetd.dataplane.rtnetlink.route_socket": DATAPLANE,
    "vnetd.control": CONTROL,
    "vnetd.control.access": CONTROL,
    "vnetd.control.assign": CONTROL,
    "vnetd.control.claim": CONTROL,
    "vnetd.control.spec_check": CONTROL,
    "vnetd.control.membership": CONTROL,
    "vnetd.control.proof": CONTROL,
    "vnetd.control.holders": CONTROL,
    "vnetd.control.retry": CONTROL,
    "vnetd.control.storm": CONTROL,
    "vnetd.control.watcher": CONTROL,
    "vnetd.control.member_view": CONTROL,
    "vnetd.control.log_limit": CONTROL,
    "vnetd.observe": OBSERVE,
    "vnetd.observe.endpoints": OBSERVE,
    "vnetd.observe.http": OBSERVE,
    "vnetd.observe.metrics": OBSERVE,
    "vnetd.observe.readiness": OBSERVE,
    "vnetd.daemon": DAEMON,
    "vnetd.daemon.control_plane": DAEMON,
    "vnetd.daemon.reconciler": DAEMON,
    "vnetd.daemon.plan_log": DAEMON,
    "vnetd.daemon.root": DAEMON,
    "vnetd.daemon.running": DAEMON,
    "vnetd.doctor.service": DAEMON,
    "vnetd.doctor.echo": DAEMON,
    "vnetd.__main__": COMMANDS,
    "vnetd.cli": COMMANDS,
    "vnetd.commands": COMMANDS,
    "vnetd.commands.address_plan": COMMANDS,
    "vnetd.commands.demo": COMMANDS,
    "vnetd.commands.provision": COMMANDS,
    "vnetd.commands.register": COMMANDS,
    "vnetd.commands.signing_key": COMMANDS,
    "vnetd.commands.up": COMMANDS,
    "vnetd.render.cluster_command": COMMANDS,
    "vnetd.render.command": COMMANDS,
    "vnetd.render.members": COMMANDS,
    "vnetd.status.command": COMMANDS,
    "vnetd.status.show": COMMANDS,
    "vnetd.wait.command": COMMANDS,
    "vnetd.wait.run": COMMANDS,
    "vnetd.doctor.command": COMMANDS,
    "vnetd.doctor.gather": COMMANDS,
    "vnetd.lab": LAB,
    "vnetd.lab.cluster": LAB,
    "vnetd.lab.demo_mesh": LAB,
    "vnetd.lab.etcd": LAB,
    "vnetd.lab.etcd_cluster": LAB,
    "vnetd.lab.etcd_faults": LAB,
    "vnetd.lab.guest": LAB,
    "vnetd.lab.guest_image": LAB,
    "vnetd.lab.layout": LAB,
    "vnetd.lab.markers": LAB,
    "vnetd.lab.netns": LAB,
    "vnetd.lab.open_lab": LAB,
    "vnetd.lab.pods": LAB,
    "vnetd.lab.probe": LAB,
    "vnetd.lab.sites": LAB,
    "vnetd.lab.underlay": LAB,
}

ONLY_IMPORTED_BY: dict[str, set[str]] = {
    "httpx": {
        "vnetd.registry.etcd",
        "vnetd.registry.etcd_gateway",
        "vnetd.registry.etcd_security",
        "vnetd.registry.etcd_watch",
    },
    "httpcore": {"vnetd.registry.httpcore_package"},
    "pyroute2": {
        name
        for name in LAYER_OF
        if name.startswith(("vnetd.dataplane.rtnetlink.", "vnetd.dataplane.kernel."))
    },
    "cryptography": {"vnetd.keys", "vnetd.registry.etcd_security", "vnetd.control.proof"},
}
"""The library rules: only these modules import the library (the lab, test tooling, is
exempt: it checks etcd's health over httpx)."""

PORTS = ("vnetd.registry", "vnetd.dataplane")

BACKENDS = {
    "vnetd.registry.etcd",
    "vnetd.registry.etcd_auth",
    "vnetd.registry.etcd_endpoints",
    "vnetd.registry.etcd_gateway",
    "vnetd.registry.etcd_pages",
    "vnetd.registry.etcd_security",
    "vnetd.registry.etcd_watch",
    "vnetd.registry.httpcore_package",
    "vnetd.registry.memory",
    "vnetd.dataplane.fake",
    "vnetd.dataplane.kernel.device",
    "vnetd.dataplane.wireguard_go.supervise",
    "vnetd.dataplane.wireguard_go.device",
    "vnetd.dataplane.wireguard_go.uapi_client",
}
"""Imported only inside their port package: everyone else opens them through the port
(``open_registry``, ``choose_dataplane`` / ``open_dataplane``)."""


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

DIRECT = {
    name: {i for i in imports(tree) if i in SOURCES and i != name} for name, tree in SOURCES.items()
}
"""Each module's own modules of vnetd it imports (``from vnetd.x import y`` counts as
``vnetd.x``, and as ``vnetd.x.y`` when that is a module)."""


def closure(name: str) -> set[str]:
    """Every module of vnetd that importing ``name`` can reach (itself excluded)."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        for nxt in DIRECT[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen - {name}


def libraries(name: str) -> set[str]:
    """The top-level packages outside vnetd that ``name`` imports directly."""
    return {i.split(".")[0] for i in imports(SOURCES[name]) if not within(i, "vnetd")}


def test_the_table_names_every_module() -> None:
    assert sorted(SOURCES.keys() - LAYER_OF.keys()) == []


def test_the_table_names_no_missing_module() -> None:
    assert sorted(LAYER_OF.keys() - SOURCES.keys()) == []


def test_every_layer_may_import_itself_and_what_its_layers_may() -> None:
    """``MAY_IMPORT`` is closed: a layer allowed another is allowed what that one is."""
    for layer, allowed in MAY_IMPORT.items():
        assert layer in allowed
        for other in allowed:
            assert sorted(MAY_IMPORT[other] - allowed) == [], (layer, other)


@pytest.mark.parametrize("name", sorted(LAYER_OF.keys() & SOURCES.keys()))
def test_a_module_reaches_only_the_layers_it_may(name: str) -> None:
    allowed = MAY_IMPORT[LAYER_OF[name]]
    reached = {m: LAYER_OF.get(m, "unnamed") for m in closure(name)}
    beyond = sorted(f"{m} ({layer})" for m, layer in reached.items() if layer not in allowed)
    assert beyond == [], f"{name} ({LAYER_OF[name]}) reaches {', '.join(beyond)}"


@pytest.mark.parametrize(
    "name", sorted(n for n, layer in LAYER_OF.items() if layer in PURE and n in SOURCES)
)
def test_the_pure_core_reaches_no_io_library(name: str) -> None:
    reached = {m: libraries(m) & IO_LIBRARIES for m in {name, *closure(name)}}
    impure = sorted(f"{m}: {', '.join(sorted(libs))}" for m, libs in reached.items() if libs)
    assert impure == [], f"{name} reaches {'; '.join(impure)}"


@pytest.mark.parametrize("library", sorted(ONLY_IMPORTED_BY))
def test_a_library_is_imported_only_where_the_doc_says(library: str) -> None:
    users = {n for n in SOURCES if library in libraries(n) and not within(n, "vnetd.lab")}
    others = sorted(users - ONLY_IMPORTED_BY[library])
    assert others == [], f"{library} is imported by {', '.join(others)}"


def module_map() -> list[tuple[str, set[str], set[str]]]:
    """The rows of the doc's module map: (layer, its modules, the layers it may import)."""
    section = DOC.read_text().split("\n## Module map\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 4 or cells[0] in ("layer", "---"):
            continue
        layer, names, _role, may_import = cells
        named = {n if n == "vnetd" else f"vnetd.{n}" for n in re.findall(r"`([\w.]+)`", names)}
        rows.append((layer, named, {other.strip() for other in may_import.split(",")}))
    return rows


def test_the_module_map_has_a_row_per_layer_in_order() -> None:
    assert [layer for layer, _named, _may in module_map()] == list(MAY_IMPORT)


@pytest.mark.parametrize("row", module_map(), ids=lambda row: row[0])
def test_the_module_map_row_says_what_the_table_says(
    row: tuple[str, set[str], set[str]],
) -> None:
    layer, named, may_import = row
    assert sorted(named) == sorted(n for n, of in LAYER_OF.items() if of == layer)
    assert may_import == MAY_IMPORT.get(layer)


def test_every_backend_exists() -> None:
    assert BACKENDS <= SOURCES.keys()


@pytest.mark.parametrize(
    "name", sorted(n for n in SOURCES if not any(within(n, p) for p in (*PORTS, "vnetd.lab")))
)
def test_backends_are_opened_through_their_port(name: str) -> None:
    used = {b for b in BACKENDS for i in imports(SOURCES[name]) if within(i, b)}
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
