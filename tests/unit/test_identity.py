from __future__ import annotations

import base64
import stat
from pathlib import Path

import pytest

from vnetd.errors import IdentityError
from vnetd.identity import named_file, resolve_endpoint, resolve_rank, resolve_signing_key_file
from vnetd.keys import load_or_create_key, public_key_of
from vnetd.spec import parse_spec

SPEC = parse_spec(
    {
        "mesh": {
            "name": "m",
            "size": 8,
            "network": "10.250.0.0/16",
            "hostname": "flux-{rank}",
            "port": 51820,
        }
    }
)


@pytest.mark.parametrize(
    ("flag", "env", "hostname", "rank"),
    [
        pytest.param("3", {"VNETD_RANK": "4"}, "flux-5", 3, id="flag-first"),
        pytest.param(
            None, {"VNETD_RANK": "4", "JOB_COMPLETION_INDEX": "6"}, "flux-5", 4, id="env-second"
        ),
        pytest.param(None, {"JOB_COMPLETION_INDEX": "6"}, "flux-5", 6, id="job-index-third"),
        pytest.param(None, {}, "flux-5", 5, id="hostname-last"),
        pytest.param(None, {}, "flux-5.flux.default.svc", 5, id="hostname-fqdn"),
    ],
)
def test_rank_sources_in_order(flag, env, hostname, rank):
    assert resolve_rank(SPEC, flag, env, hostname) == rank


@pytest.mark.parametrize(
    ("flag", "env", "hostname", "message"),
    [
        pytest.param("8", {}, "x", r"--rank: rank 8 is out of range: .* 0\.\.7", id="out-of-range"),
        pytest.param(
            None, {"VNETD_RANK": "-1"}, "x", r"VNETD_RANK: '-1' is not a rank", id="negative"
        ),
        pytest.param(None, {}, "login1", r"no rank: .*'flux-0'.*'login1'", id="none"),
    ],
)
def test_rank_errors(flag, env, hostname, message):
    with pytest.raises(IdentityError, match=message):
        resolve_rank(SPEC, flag, env, hostname)


@pytest.mark.parametrize(
    ("flag", "env", "route_ip", "expected"),
    [
        pytest.param(
            "198.18.0.9:4000", {"POD_IP": "198.18.0.1"}, None, "198.18.0.9:4000", id="flag"
        ),
        pytest.param(None, {"POD_IP": "198.18.0.1"}, "198.18.0.2", "198.18.0.1:51820", id="pod-ip"),
        pytest.param(None, {"POD_IP": "fd00::5"}, None, "[fd00::5]:51820", id="pod-ip-v6"),
        pytest.param(None, {}, "198.18.0.2", "198.18.0.2:51820", id="default-route"),
    ],
)
def test_endpoint_sources(flag, env, route_ip, expected):
    assert resolve_endpoint(SPEC, flag, env, route_ip) == expected


def test_endpoint_missing_is_clear():
    with pytest.raises(IdentityError, match="no endpoint"):
        resolve_endpoint(SPEC, None, {}, None)
    with pytest.raises(IdentityError, match="--endpoint"):
        resolve_endpoint(SPEC, "nohost", {}, None)


def test_key_is_created_once_0600_and_reused(tmp_path):
    state = tmp_path / "state"
    first = load_or_create_key(state)
    again = load_or_create_key(state)
    assert first == again
    assert stat.S_IMODE((state / "private.key").stat().st_mode) == 0o600
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert len(base64.b64decode(first.public_key)) == 32
    assert first.private_key not in repr(first)


def test_loose_key_file_is_refused(tmp_path):
    load_or_create_key(tmp_path)
    (tmp_path / "private.key").chmod(0o644)
    with pytest.raises(IdentityError, match="chmod 600"):
        load_or_create_key(tmp_path)


def test_public_key_matches_wireguard_vector():
    # `wg pubkey` (wireguard-tools) printed this for the private key bytes 0..31.
    private = base64.b64encode(bytes(range(32))).decode()
    assert public_key_of(private) == "j0DFrbaPJWJK5bIU6nZ6bslNgp09e14a0bpvPiE4KF8="


def test_pod_ip_with_an_ipv6_zone_is_refused_at_start(tmp_path):
    # Every peer would skip an entry with a zone (wireguard-go refuses it), so
    # the daemon must not start with one.
    spec = parse_spec({"mesh": {"name": "m", "size": 2, "network": "10.0.0.0/24"}})
    with pytest.raises(IdentityError, match="POD_IP"):
        resolve_endpoint(spec, None, {"POD_IP": "fe80::1%eth0"}, None)


def test_a_loose_state_dir_is_tightened_to_0700(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    state.chmod(0o755)  # as a hostPath comes
    load_or_create_key(state)
    assert state.stat().st_mode & 0o777 == 0o700


def test_the_key_is_not_written_through_a_planted_temporary_file(tmp_path):
    """A ``private.tmp`` left behind, even a symlink to another file, is replaced: the
    key goes into a new 0600 file, never into what the link points at."""
    target = tmp_path / "elsewhere"
    target.write_text("untouched\n")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "private.tmp").symlink_to(target)
    pair = load_or_create_key(state)
    assert target.read_text() == "untouched\n"
    key = state / "private.key"
    assert not key.is_symlink() and key.stat().st_mode & 0o777 == 0o600
    assert key.read_text().strip() == pair.private_key
    assert not (state / "private.tmp").exists()


@pytest.mark.parametrize(
    ("flag", "env", "spec_file", "named"),
    [
        pytest.param("/f", {"VNETD_SIGNING_KEY_FILE": "/e"}, "/s", ("--signing-key-file", "/f"),
                     id="flag-first"),
        pytest.param("", {"VNETD_SIGNING_KEY_FILE": "/e"}, "/s", ("VNETD_SIGNING_KEY_FILE", "/e"),
                     id="variable-second"),
        pytest.param(None, {"VNETD_SIGNING_KEY_FILE": ""}, "/s",
                     ("wireguard.signing_key_file", "/s"), id="spec-last"),
        pytest.param(None, {}, None, None, id="none"),
    ],
)  # fmt: skip
def test_a_file_is_named_by_flag_then_variable_then_spec(flag, env, spec_file, named) -> None:
    """The one lookup the signing key, rank certificate and pre-shared key files share."""
    spec = parse_spec({"mesh": {"name": "m", "size": 2, "network": "10.250.0.0/16"},
                       "wireguard": {"signing_key_file": spec_file} if spec_file else {}})  # fmt: skip
    found = resolve_signing_key_file(flag, env, spec)
    assert found == (None if named is None else (named[0], Path(named[1])))
    assert named_file(("--signing-key-file", flag), "VNETD_SIGNING_KEY_FILE", env,
                      ("wireguard.signing_key_file", spec_file)) == found  # fmt: skip
