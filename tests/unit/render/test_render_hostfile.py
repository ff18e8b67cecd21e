from __future__ import annotations

import pytest
from render_fixtures import DUAL, EXAMPLE, LAB, LAB6

from vnetd.render.hostfile import render_hostfile
from vnetd.spec import MeshSpec, load_spec


@pytest.mark.parametrize(
    ("spec", "fmt", "slots", "names", "expected"),
    [
        pytest.param(
            LAB,
            "openmpi",
            1,
            "address",
            "10.250.0.1 slots=1\n10.250.0.2 slots=1\n10.250.0.3 slots=1\n10.250.0.4 slots=1\n",
            id="openmpi-default",
        ),
        pytest.param(
            LAB,
            "openmpi",
            4,
            "hostname",
            "lab-0 slots=4\nlab-1 slots=4\nlab-2 slots=4\nlab-3 slots=4\n",
            id="openmpi-names",
        ),
        pytest.param(
            LAB,
            "mpich",
            2,
            "address",
            "10.250.0.1:2\n10.250.0.2:2\n10.250.0.3:2\n10.250.0.4:2\n",
            id="mpich",
        ),
        pytest.param(
            LAB, "mpich", 1, "hostname", "lab-0:1\nlab-1:1\nlab-2:1\nlab-3:1\n", id="mpich-names"
        ),
        pytest.param(
            LAB, "plain", 1, "hostname", "lab-0\nlab-1\nlab-2\nlab-3\n", id="plain-one-slot"
        ),
        pytest.param(
            LAB,
            "plain",
            3,
            "address",
            "".join(f"10.250.0.{r}\n" * 3 for r in range(1, 5)),
            id="plain-one-line-per-slot",
        ),
        pytest.param(
            LAB6,
            "openmpi",
            1,
            "address",
            "".join(f"fd00:250::{r} slots=1\n" for r in range(1, 6)),
            id="openmpi-ipv6",
        ),
        pytest.param(
            LAB6,
            "mpich",
            8,
            "hostname",
            "".join(f"lab6-{r}:8\n" for r in range(5)),
            id="mpich-ipv6-names",
        ),
    ],
)
def test_hostfile(spec: MeshSpec, fmt, slots: int, names, expected: str):
    assert render_hostfile(spec, fmt, slots, names) == expected


@pytest.mark.parametrize(
    ("fmt", "slots", "names", "name"),
    [
        pytest.param("openmpi", 1, "address", "hostfile-example-openmpi.txt", id="openmpi"),
        pytest.param("mpich", 4, "hostname", "hostfile-example-mpich-hostname.txt", id="mpich"),
        pytest.param("plain", 2, "address", "hostfile-example-plain.txt", id="plain"),
    ],
)
def test_hostfile_matches_golden(fmt, slots: int, names, name: str, golden):
    golden(name, render_hostfile(load_spec(EXAMPLE), fmt, slots, names))


@pytest.mark.parametrize(
    ("fmt", "family", "name"),
    [
        pytest.param("openmpi", None, "hostfile-ds-openmpi.txt", id="primary"),
        pytest.param("openmpi", 4, "hostfile-ds-openmpi.txt", id="family4"),
        pytest.param("openmpi", 6, "hostfile-ds-openmpi-family6.txt", id="family6"),
        pytest.param("mpich", 4, "hostfile-ds-mpich-family4.txt", id="mpich-family4"),
    ],
)
def test_dual_stack_hostfile_matches_golden(fmt, family: int | None, name: str, golden):
    golden(name, render_hostfile(DUAL, fmt, 1, "address", family))


def test_dual_stack_hostfile_names_ignore_the_family():
    assert render_hostfile(DUAL, "plain", 1, "hostname", 6) == "ds-0\nds-1\nds-2\n"


@pytest.mark.parametrize(
    ("spec", "fmt", "slots", "names", "family", "message"),
    [
        pytest.param(LAB, "openmpi", 0, "address", None, "slots 0", id="zero-slots"),
        pytest.param(LAB6, "mpich", 1, "address", None, "IPv6", id="mpich-ipv6-addresses"),
        pytest.param(DUAL, "mpich", 1, "address", 6, "IPv6", id="mpich-dual-stack-family6"),
        pytest.param(LAB, "openmpi", 1, "address", 6, "no IPv6 network", id="ipv4-family6"),
        pytest.param(LAB6, "openmpi", 1, "address", 4, "no IPv4 network", id="ipv6-family4"),
    ],
)
def test_hostfile_rejects(spec: MeshSpec, fmt, slots: int, names, family, message: str):
    with pytest.raises(ValueError, match=message):
        render_hostfile(spec, fmt, slots, names, family)
