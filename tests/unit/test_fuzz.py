"""Property tests: whatever the input, the parsers return a value or raise a ``VnetdError``.

Inputs come from hypothesis, with a fixed seed and a bounded number of
examples so CI runs are repeatable and short. The strategies lean towards
the shapes the parsers expect (TOML tables with the real keys, JSON member
records, rank lists), with junk mixed in at every level, so most examples
get past the first check.
"""

from __future__ import annotations

import base64
import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from vnetd.control.membership import check_endpoint, decode_member, member_key
from vnetd.errors import VnetdError
from vnetd.ranks import parse_ranks
from vnetd.spec import check_etcd_url, check_listen, load_spec, parse_spec

EXAMPLES = 400
SEED = 20261129
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=False,
    suppress_health_check=[HealthCheck.too_slow],
)
SPEC = parse_spec({"mesh": {"name": "fuzz", "size": 8, "network": "10.250.0.0/16"}})

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
toml_scalars = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=30),
    st.sampled_from(["10.250.0.0/16", "fd00:250::/64", "10.250.0.1/16", "vnet0", "{name}-{rank}",
                     "x{rank}y", "http://127.0.0.1:2379", "/vnetd", "0.0.0.0:9090", "[::]:0"]),
)  # fmt: skip
MESH_KEYS = ["name", "size", "network", "network6", "port", "interface", "mtu", "hostname",
             "offset", "persistent_keepalive", "colour"]  # fmt: skip
REGISTRY_KEYS = ["endpoints", "prefix", "lease_ttl", "bogus"]
toml_values = st.one_of(toml_scalars, st.lists(toml_scalars, max_size=3))


def table(keys: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(st.sampled_from(keys) | st.text(max_size=8), toml_values, max_size=9)


documents = st.fixed_dictionaries(
    {},
    optional={
        "mesh": table(MESH_KEYS) | toml_scalars,
        "registry": table(REGISTRY_KEYS) | toml_scalars,
        "http": table(["listen"]),
        "extra": toml_scalars,
    },
)


@seed(SEED)
@FUZZ
@given(documents)
def test_parse_spec_returns_a_spec_or_a_vnetd_error(document: dict[str, Any]) -> None:
    try:
        spec = parse_spec(document)
    except VnetdError:
        return
    # A spec that parses is usable: every rank has an address and a host name.
    assert spec.size >= 1
    spec.address(spec.size - 1)
    assert len(spec.addresses(spec.size - 1)) == len(spec.allowed_ips(0)) == len(spec.networks)
    spec.canonical_json()
    spec.host(0)


@seed(SEED)
@FUZZ
@given(st.text(max_size=300) | st.binary(max_size=300).map(lambda b: b.decode("latin-1")))
def test_load_spec_of_any_file_returns_a_spec_or_a_vnetd_error(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mesh.toml"
        path.write_text(text, encoding="utf-8", errors="surrogateescape")
        try:
            load_spec(path)
        except VnetdError:
            pass


keys_b64 = st.one_of(
    st.binary(min_size=32, max_size=32).map(lambda b: base64.b64encode(b).decode()),
    st.binary(max_size=40).map(lambda b: base64.b64encode(b).decode()),
    st.text(max_size=50),
)
endpoints = st.one_of(
    st.none(),
    st.text(max_size=40),
    st.sampled_from(["198.18.1.1:51820", "[fd00::1]:51820", "[fe80::1%eth0]:1", "host:1",
                     "1.2.3.4:0", "1.2.3.4:65536", "[::1]", ":51820", "1.2.3.4:-1"]),
)  # fmt: skip
records = st.one_of(
    st.fixed_dictionaries(
        {"public_key": keys_b64, "endpoint": endpoints, "instance": st.text(max_size=20)},
        optional={
            "started": scalars,
            "version": scalars,
            "allowed_ips": json_values,
            "rank": scalars,
            "device": scalars,
        },
    ),
    json_values,
)
member_keys = st.one_of(
    st.integers(min_value=-3, max_value=12).map(lambda r: member_key(SPEC, r) if r >= 0 else "x"),
    st.text(max_size=12).map(lambda t: f"/vnetd/fuzz/members/{t}"),
    st.text(max_size=40),
)


@seed(SEED)
@FUZZ
@given(member_keys, records | st.binary(max_size=200))
def test_decode_member_returns_a_member_or_a_bad_entry(key: str, record: Any) -> None:
    if isinstance(record, bytes):
        value = record
    else:
        try:
            value = json.dumps(record).encode()
        except (ValueError, OverflowError):
            value = repr(record).encode()
    try:
        member = decode_member(SPEC, key, value)
    except VnetdError as exc:
        message = str(exc)
    else:
        assert 0 <= member.rank < SPEC.size
        assert len(base64.b64decode(member.public_key)) == 32
        return
    assert "\n" not in message, "a bad entry's message must fit on one log line"


@seed(SEED)
@FUZZ
@given(st.text(max_size=60))
def test_check_endpoint_accepts_or_raises_value_error(text: str) -> None:
    try:
        check_endpoint(text)
    except ValueError:
        pass


rank_lists = st.one_of(
    st.text(max_size=40),
    st.text(alphabet="0123456789,- ", max_size=30),
    st.lists(
        st.one_of(
            st.integers(min_value=-5, max_value=40).map(str),
            st.tuples(st.integers(-5, 40), st.integers(-5, 40)).map(lambda t: f"{t[0]}-{t[1]}"),
            st.just("all"),
            st.just(""),
        ),
        max_size=6,
    ).map(",".join),
)


@seed(SEED)
@FUZZ
@given(rank_lists, st.integers(min_value=1, max_value=64))
def test_parse_ranks_returns_ranks_in_range_or_a_vnetd_error(text: str, size: int) -> None:
    try:
        ranks = parse_ranks(text, size)
    except VnetdError as exc:
        message = str(exc)
    else:
        assert list(ranks) == sorted(set(ranks))
        assert all(0 <= r < size for r in ranks)
        return
    assert "--ranks" in message


@seed(SEED)
@FUZZ
@given(st.text(max_size=60))
def test_url_and_listen_checks_return_or_raise_a_vnetd_error(text: str) -> None:
    for check in (check_etcd_url, check_listen):
        try:
            check(text)
        except VnetdError:
            pass
