"""The mesh spec: a small TOML file from which every address is derived.

The address plan is a pure function of the spec: rank ``r`` owns host
number ``offset + r`` of ``network`` and, in a dual-stack mesh, the same
host number of ``network6``. Everything the consumers need (Flux
bootstrap config, ``/etc/hosts``, MPI host files) can therefore be written
before any pod exists. ``docs/spec.md`` documents every key.
"""

from vnetd.spec.parse import (
    check_etcd_url,
    check_listen,
    check_relay_url,
    check_site_name,
    load_spec,
    parse_spec,
)
from vnetd.spec.records import (
    DATAPLANE_KINDS,
    DATAPLANES,
    DEFAULT_SITE,
    WATCH_TRANSPORTS,
    DataplaneSpec,
    HttpSpec,
    IPAddress,
    IPNetwork,
    MeshSpec,
    RegistrySpec,
    SiteSpec,
    check_watch,
)

__all__ = [
    "DATAPLANE_KINDS",
    "DATAPLANES",
    "DEFAULT_SITE",
    "DataplaneSpec",
    "HttpSpec",
    "IPAddress",
    "IPNetwork",
    "MeshSpec",
    "RegistrySpec",
    "SiteSpec",
    "WATCH_TRANSPORTS",
    "check_etcd_url",
    "check_listen",
    "check_relay_url",
    "check_site_name",
    "check_watch",
    "load_spec",
    "parse_spec",
]
