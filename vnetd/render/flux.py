"""The Flux ``[bootstrap]`` table (flux-config-bootstrap(5)) of a mesh.

A broker finds its rank as the index of the first ``hosts`` entry whose
``host`` equals its hostname, so the array is written in rank order, one
entry per rank, with the rank's fixed overlay address in ``bind`` and
``connect``.

The TOML is written by hand. ``tomllib`` only reads, and ``tomli-w`` (not a
dependency) cannot write an array of inline tables one table per line: it
gives ``[[bootstrap.hosts]]`` sections or one long line, and one line per
rank is what makes the table readable and diffable. The values are only
strings, integers and booleans. Strings are encoded with ``json.dumps``:
JSON's escapes (``\\"``, ``\\\\``, ``\\n``, ``\\t``, ``\\uXXXX``, ...) are a
subset of TOML basic-string escapes. ``ensure_ascii=False`` keeps non-ASCII
characters literal, because JSON would write those outside the BMP as a
surrogate pair, which TOML rejects; DEL, which JSON leaves raw and TOML
forbids unescaped, is escaped by hand.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from vnetd.spec import MeshSpec

BindMode = Literal["address", "interface"]

DEFAULT_CURVE_CERT = "/etc/flux/system/curve.cert"
DEFAULT_PORT = 8050

TomlValue = str | int | bool


@dataclass(frozen=True)
class FluxOptions:
    """What the spec does not say: the broker port, the certificate and the tree.

    Attributes:
        bind: ``address`` binds each broker to its overlay address;
            ``interface`` to the overlay interface by name.
        fanout: with a value K, rank r > 0 gets ``parent`` = rank (r-1)//K
            (Flux's k-ary tree numbering); None leaves the topology to Flux.
        family: the IP version (4 or 6) of the addresses written; None: the
            primary network's. Family 6 sets ``enable_ipv6``.
    """

    curve_cert: str = DEFAULT_CURVE_CERT
    port: int = DEFAULT_PORT
    bind: BindMode = "address"
    fanout: int | None = None
    family: int | None = None


def render_flux(spec: MeshSpec, options: FluxOptions | None = None) -> str:
    """The ``[bootstrap]`` table of ``spec`` as TOML text ending in a newline.

    Raises:
        ValueError: ``options.port`` or ``options.fanout`` out of range, or
            the mesh has no network of ``options.family`` (the command checks
            these first and names the flag).
    """
    options = options or FluxOptions()
    if not 1 <= options.port <= 65535:
        raise ValueError(f"port {options.port} is out of range 1..65535")
    if options.fanout is not None and options.fanout < 1:
        raise ValueError(f"fanout {options.fanout} is less than 1")
    version = _version(spec, options)
    lines = [
        f"# Flux bootstrap config rendered by vnetd from mesh {spec.name}.",
        "# Rank r is hosts[r]; each node's hostname must equal its host value.",
        "[bootstrap]",
    ]
    if version == 6:
        lines.append("enable_ipv6 = true")
    lines.append(f"curve_cert = {toml_value(options.curve_cert)}")
    lines.append(f"default_port = {toml_value(options.port)}")
    lines.append("hosts = [")
    lines.extend(f"  {inline_table(host_entry(spec, rank, options))}," for rank in range(spec.size))
    lines.append("]")
    return "\n".join(lines) + "\n"


def host_entry(spec: MeshSpec, rank: int, options: FluxOptions) -> list[tuple[str, TomlValue]]:
    """The ``hosts`` entry of ``rank`` as ordered key/value pairs."""
    address = spec.address_in(rank, _version(spec, options))
    connect_host = f"[{address}]" if address.version == 6 else str(address)
    bind_host = spec.interface if options.bind == "interface" else connect_host
    entry: list[tuple[str, TomlValue]] = [
        ("host", spec.host(rank)),
        ("bind", f"tcp://{bind_host}:{options.port}"),
        ("connect", f"tcp://{connect_host}:{options.port}"),
    ]
    if options.fanout is not None and rank > 0:
        entry.append(("parent", spec.host((rank - 1) // options.fanout)))
    return entry


def _version(spec: MeshSpec, options: FluxOptions) -> int:
    """The IP version of the addresses written: ``options.family`` or the primary's."""
    version = spec.network.version if options.family is None else options.family
    if version not in spec.versions:
        raise ValueError(f"mesh {spec.name} has no IPv{version} network")
    return version


def inline_table(pairs: list[tuple[str, TomlValue]]) -> str:
    """``{ key = value, ... }`` on one line; keys must be bare TOML keys."""
    return "{ " + ", ".join(f"{key} = {toml_value(value)}" for key, value in pairs) + " }"


def toml_value(value: TomlValue) -> str:
    """A TOML string, integer or boolean literal."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
