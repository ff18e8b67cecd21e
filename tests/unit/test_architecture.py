"""The layer table of docs/architecture.md's module map, checked on the source and the doc.

``LAYER_OF`` names every module of ``vnetd/`` and its layer; ``MAY_IMPORT``
says which layers a layer's modules may reach. Both are checked on the import
*closure*: everything Python runs when the module is imported and when its
functions run. The closure follows every import statement, top-level and lazy
(inside a function, or under ``TYPE_CHECKING``), absolute and relative (``from
.keys import KeyPair`` in ``vnetd/ranks.py`` is ``vnetd.keys``), and each
parent package's ``__init__`` of every module it reaches (importing
``vnetd.a.b.c`` runs ``vnetd/__init__``, ``vnetd/a/__init__`` and
``vnetd/a/b/__init__``). So "pure" means pure one step removed as well as
directly, and a package's ``__init__`` imports nothing of a higher layer than
its modules' own.

The other rules, each checked on every module:

* No file-level circle. The graph is the modules' own import statements, lazy ones
  included (``from pkg import mod`` is an edge to ``pkg.mod`` when that is a module,
  and to ``pkg``). The implicit edge from a module to its parent package's
  ``__init__`` is left out of this graph (it is in the closure above): with it every
  package ``__init__`` that imports its own modules would be a circle, although
  Python runs the ``__init__`` first and the module after, in one order. A module
  that imports its own package back, while that package's ``__init__`` imports it,
  is a circle and fails.
* No environment read (``os.environ``, ``os.environb``, ``os.getenv``, ``os.putenv``,
  ``os.unsetenv``, or those names imported from ``os``) outside the layers that
  resolve the settings (``READS_ENVIRONMENT``); the lab, test tooling, is exempt.
* The library rules the doc states (``ONLY_IMPORTED_BY``), on direct imports.
* A backend is imported only inside its port package.
* No module over ``MAX_LINES`` lines.

The doc's map has one row per layer, in this order, naming the same modules and the
same layers.
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
    "vnetd.asgi": CORE,
    "vnetd.ranks": CORE,
    "vnetd.pacing": CORE,
    "vnetd.spec": CORE,
    "vnetd.spec.parse": CORE,
    "vnetd.spec.checks": CORE,
    "vnetd.spec.records": CORE,
    "vnetd.mesh": TOPOLOGY,
    "vnetd.mesh.gateways": TOPOLOGY,
    "vnetd.mesh.initiator": TOPOLOGY,
    "vnetd.mesh.eager": TOPOLOGY,
    "vnetd.mesh.peers": TOPOLOGY,
    "vnetd.mesh.rings": TOPOLOGY,
    "vnetd.render": VIEWS,
    "vnetd.render.flux": VIEWS,
    "vnetd.render.hostfile": VIEWS,
    "vnetd.render.hosts": VIEWS,
    "vnetd.render.manifests": VIEWS,
    "vnetd.render.minicluster": VIEWS,
    "vnetd.render.minicluster_site": VIEWS,
    "vnetd.render.minicluster_pods": VIEWS,
    "vnetd.render.operator_versions": VIEWS,
    "vnetd.render.monitoring": VIEWS,
    "vnetd.render.provision_job": VIEWS,
    "vnetd.render.relays": VIEWS,
    "vnetd.render.output": VIEWS,
    "vnetd.render.pods": VIEWS,
    "vnetd.render.podscripts": VIEWS,
    "vnetd.render.secretfiles": VIEWS,
    "vnetd.render.rank_certs": VIEWS,
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
    "vnetd.doctor.sidecars": VIEWS,
    "vnetd.keys": LEAVES,
    "vnetd.logs": LEAVES,
    "vnetd.gc_pause": LEAVES,
    "vnetd.config": SETTINGS,
    "vnetd.daemon_settings": SETTINGS,
    "vnetd.identity": SETTINGS,
    "vnetd.registry": REGISTRY,
    "vnetd.registry.access_base": REGISTRY,
    "vnetd.registry.base": REGISTRY,
    "vnetd.registry.bounds": REGISTRY,
    "vnetd.registry.etcd": REGISTRY,
    "vnetd.registry.etcd.auth": REGISTRY,
    "vnetd.registry.etcd.client": REGISTRY,
    "vnetd.registry.etcd.endpoints": REGISTRY,
    "vnetd.registry.etcd.gateway": REGISTRY,
    "vnetd.registry.etcd.grpc_codec": REGISTRY,
    "vnetd.registry.etcd.grpc_stream": REGISTRY,
    "vnetd.registry.etcd.grpc_watch": REGISTRY,
    "vnetd.registry.etcd.httpcore_package": REGISTRY,
    "vnetd.registry.etcd.pages": REGISTRY,
    "vnetd.registry.etcd.security": REGISTRY,
    "vnetd.registry.etcd.tokens": REGISTRY,
    "vnetd.registry.etcd.transport": REGISTRY,
    "vnetd.registry.etcd.watch": REGISTRY,
    "vnetd.registry.memory": REGISTRY,
    "vnetd.registry.opener": REGISTRY,
    "vnetd.registry.relay": REGISTRY,
    "vnetd.registry.relay.app": REGISTRY,
    "vnetd.registry.relay.cache": REGISTRY,
    "vnetd.registry.relay.reads": REGISTRY,
    "vnetd.registry.relay.service": REGISTRY,
    "vnetd.registry.relay.tls": REGISTRY,
    "vnetd.registry.relay.upstream": REGISTRY,
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
    "vnetd.control.endpoint_file": CONTROL,
    "vnetd.control.claim_attempt": CONTROL,
    "vnetd.control.renewal": CONTROL,
    "vnetd.control.spec_check": CONTROL,
    "vnetd.control.membership": CONTROL,
    "vnetd.control.proof": CONTROL,
    "vnetd.control.rank_cert": CONTROL,
    "vnetd.control.holders": CONTROL,
    "vnetd.control.retry": CONTROL,
    "vnetd.control.write_probe": CONTROL,
    "vnetd.control.storm": CONTROL,
    "vnetd.control.watcher": CONTROL,
    "vnetd.control.member_view": CONTROL,
    "vnetd.control.watch_batch": CONTROL,
    "vnetd.control.log_limit": CONTROL,
    "vnetd.observe": OBSERVE,
    "vnetd.observe.endpoints": OBSERVE,
    "vnetd.observe.http": OBSERVE,
    "vnetd.observe.gate": OBSERVE,
    "vnetd.observe.metrics": OBSERVE,
    "vnetd.observe.readiness": OBSERVE,
    "vnetd.daemon": DAEMON,
    "vnetd.daemon.control_plane": DAEMON,
    "vnetd.daemon.reconciler": DAEMON,
    "vnetd.daemon.plan_log": DAEMON,
    "vnetd.daemon.root": DAEMON,
    "vnetd.daemon.running": DAEMON,
    "vnetd.daemon.probe_service": DAEMON,
    "vnetd.daemon.probe_echo": DAEMON,
    "vnetd.daemon.doorbell": DAEMON,
    "vnetd.__main__": COMMANDS,
    "vnetd.cli": COMMANDS,
    "vnetd.commands": COMMANDS,
    "vnetd.commands.address_plan": COMMANDS,
    "vnetd.commands.demo": COMMANDS,
    "vnetd.commands.provision": COMMANDS,
    "vnetd.commands.register": COMMANDS,
    "vnetd.commands.relay": COMMANDS,
    "vnetd.commands.signing_key": COMMANDS,
    "vnetd.commands.rank_cert": COMMANDS,
    "vnetd.commands.up": COMMANDS,
    "vnetd.commands.render": COMMANDS,
    "vnetd.commands.render.cluster": COMMANDS,
    "vnetd.commands.render.command": COMMANDS,
    "vnetd.commands.render.members": COMMANDS,
    "vnetd.commands.status": COMMANDS,
    "vnetd.commands.status.command": COMMANDS,
    "vnetd.commands.status.plan": COMMANDS,
    "vnetd.commands.status.show": COMMANDS,
    "vnetd.commands.wait": COMMANDS,
    "vnetd.commands.wait.command": COMMANDS,
    "vnetd.commands.wait.run": COMMANDS,
    "vnetd.commands.doctor": COMMANDS,
    "vnetd.commands.doctor.command": COMMANDS,
    "vnetd.commands.doctor.plan": COMMANDS,
    "vnetd.commands.doctor.gather": COMMANDS,
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
    "nacl": {"vnetd.control.proof"},
    "httpx": {
        "vnetd.registry.etcd.client",
        "vnetd.registry.etcd.gateway",
        "vnetd.registry.etcd.security",
        "vnetd.registry.etcd.tokens",
        "vnetd.registry.etcd.watch",
    },
    "httpcore": {"vnetd.registry.etcd.httpcore_package"},
    "grpc": {"vnetd.registry.etcd.grpc_watch", "vnetd.registry.etcd.grpc_stream"},
    "google": {"vnetd.registry.etcd.grpc_codec"},  # protobuf
    "pyroute2": {
        name
        for name in LAYER_OF
        if name.startswith(("vnetd.dataplane.rtnetlink.", "vnetd.dataplane.kernel."))
    },
    "cryptography": {
        "vnetd.keys",
        "vnetd.registry.etcd.security",
        "vnetd.control.proof",
        "vnetd.control.rank_cert",
    },
}
"""The library rules: only these modules import the library (the lab, test tooling, is
exempt: it checks etcd's health over httpx)."""

PORTS = ("vnetd.registry", "vnetd.dataplane")

BACKENDS = {
    "vnetd.registry.etcd",
    "vnetd.registry.etcd.auth",
    "vnetd.registry.etcd.client",
    "vnetd.registry.etcd.endpoints",
    "vnetd.registry.etcd.gateway",
    "vnetd.registry.etcd.grpc_codec",
    "vnetd.registry.etcd.grpc_stream",
    "vnetd.registry.etcd.grpc_watch",
    "vnetd.registry.etcd.httpcore_package",
    "vnetd.registry.etcd.pages",
    "vnetd.registry.etcd.security",
    "vnetd.registry.etcd.tokens",
    "vnetd.registry.etcd.transport",
    "vnetd.registry.etcd.watch",
    "vnetd.registry.memory",
    "vnetd.dataplane.fake",
    "vnetd.dataplane.kernel.device",
    "vnetd.dataplane.wireguard_go.supervise",
    "vnetd.dataplane.wireguard_go.device",
    "vnetd.dataplane.wireguard_go.uapi_client",
}
"""Imported only inside their port package: everyone else opens them through the port
(``open_registry``, ``choose_dataplane`` / ``open_dataplane``)."""

READS_ENVIRONMENT = (SETTINGS, COMMANDS)
"""The layers that may read the environment: the settings resolve it once, into a frozen
record, and the commands hand it to them; nothing below reads it (the lab is exempt)."""

ENVIRONMENT_NAMES = {"environ", "environb", "getenv", "putenv", "unsetenv"}
"""What of ``os`` reads or writes the process's environment."""

MAX_LINES = 450
"""The most lines a module of ``vnetd/`` may have: past it, split it by responsibility."""


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


PATHS = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
SOURCES = {name: ast.parse(path.read_text()) for name, path in PATHS.items()}


def resolve(name: str, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` in module ``name`` names (relative ones too)."""
    if not node.level:
        return node.module or ""
    package = name if PATHS[name].name == "__init__.py" else name.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def imports(name: str) -> Iterator[str]:
    """Every module name imported in module ``name``, lazy and relative imports too
    (``from x import y`` yields ``x`` and ``x.y``, which is kept where it is a module)."""
    for node in ast.walk(SOURCES[name]):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = resolve(name, node)
            yield module
            yield from (f"{module}.{alias.name}" for alias in node.names if alias.name != "*")


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def parents(name: str) -> set[str]:
    """The packages whose ``__init__`` Python runs before module ``name``."""
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))} & SOURCES.keys()


DIRECT = {name: {i for i in imports(name) if i in SOURCES} - {name} for name in SOURCES}
"""Each module's own modules of vnetd it imports (``from vnetd.x import y`` counts as
``vnetd.x``, and as ``vnetd.x.y`` when that is a module): the graph circles are sought in."""

RUNS = {name: DIRECT[name] | parents(name) for name in SOURCES}
"""What importing each module runs first: its imports and its parent packages' ``__init__``."""


def closure(name: str) -> set[str]:
    """Every module of vnetd that importing ``name`` can run (itself excluded)."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        for nxt in RUNS[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen - {name}


def libraries(name: str) -> set[str]:
    """The top-level packages outside vnetd that ``name`` imports directly."""
    return {i.split(".")[0] for i in imports(name) if not within(i, "vnetd")}


def environment_reads(tree: ast.AST) -> list[int]:
    """The lines of ``tree`` that touch the process's environment through ``os``."""
    aliases = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name == "os"
    }
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "os" and not node.level:
            if any(alias.name in ENVIRONMENT_NAMES for alias in node.names):
                lines.append(node.lineno)
        elif (
            isinstance(node, ast.Attribute)
            and node.attr in ENVIRONMENT_NAMES
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
        ):
            lines.append(node.lineno)
    return sorted(lines)


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


@pytest.mark.parametrize(
    "name",
    sorted(
        n
        for n in SOURCES
        if LAYER_OF.get(n) not in READS_ENVIRONMENT and not within(n, "vnetd.lab")
    ),
)
def test_only_the_settings_and_the_commands_read_the_environment(name: str) -> None:
    lines = environment_reads(SOURCES[name])
    assert lines == [], f"{name} reads the environment on lines {lines}"


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_a_module_stays_within_the_size_line(name: str) -> None:
    lines = len(PATHS[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines: split it by responsibility"


@pytest.mark.parametrize(
    ("name", "statement", "module"),
    [
        pytest.param("vnetd.ranks", "from .keys import KeyPair", "vnetd.keys", id="sibling"),
        pytest.param("vnetd.mesh.peers", "from . import gateways", "vnetd.mesh", id="package"),
        pytest.param("vnetd.mesh", "from . import peers", "vnetd.mesh", id="in-init"),
        pytest.param("vnetd.mesh.peers", "from ..keys import KeyPair", "vnetd.keys", id="up"),
        pytest.param("vnetd.mesh.peers", "from vnetd.keys import KeyPair", "vnetd.keys", id="abs"),
    ],
)
def test_a_relative_import_is_resolved(name: str, statement: str, module: str) -> None:
    node = ast.parse(statement).body[0]
    assert isinstance(node, ast.ImportFrom)
    assert resolve(name, node) == module


def test_a_closure_runs_every_parent_package() -> None:
    """``spec.records`` imports only ``errors``; its package's ``__init__`` imports
    ``spec.parse``, which imports ``model`` lazily."""
    assert {"vnetd", "vnetd.spec", "vnetd.spec.parse", "vnetd.model"} <= closure(
        "vnetd.spec.records"
    )


@pytest.mark.parametrize(
    "source",
    [
        pytest.param("import os\nos.environ.get('X')", id="environ"),
        pytest.param("import os\nos.environb", id="environb"),
        pytest.param("import os\nos.getenv('X')", id="getenv"),
        pytest.param("import os\nos.putenv('X', '1')", id="putenv"),
        pytest.param("import os as system\nsystem.environ", id="alias"),
        pytest.param("from os import environ", id="from-environ"),
        pytest.param("from os import getenv as get", id="from-getenv"),
        pytest.param("def f():\n    import os\n    return os.environ", id="lazy"),
    ],
)
def test_an_environment_read_is_seen(source: str) -> None:
    assert environment_reads(ast.parse(source)) != []


def test_other_uses_of_os_are_not_environment_reads() -> None:
    assert environment_reads(ast.parse("import os\nos.path.join('a', 'environ')")) == []


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
    used = {b for b in BACKENDS for i in imports(name) if within(i, b)}
    assert used == set()


def test_module_level_imports_have_no_cycle() -> None:
    """No circle between files, on every import statement (lazy ones included): see the
    module's docstring for why a module's edge to its parent package is left out."""
    cycle = _find_cycle(DIRECT)
    assert cycle == [], " -> ".join(cycle)


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
