"""Records vouched for by the mesh (``[mesh] rank_ca``, ``control.rank_cert``): a record
at rank k is a member only with a certificate a pinned CA issued for k whose key is the
record's signing key; each certificate verified once. E2E twin:
tests/e2e/test_rank_ca.py."""

from __future__ import annotations

import base64
import dataclasses
import logging
import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import trio
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
)
from cryptography.x509.oid import NameOID

from vnetd.cli import main
from vnetd.control import rank_cert
from vnetd.control.claim_attempt import _VOUCHED, _replaceable
from vnetd.control.membership import (
    BadEntry,
    decode_member,
    encode_member,
    member_key,
)
from vnetd.control.proof import Signer, load_signer
from vnetd.errors import IdentityError, SpecError
from vnetd.identity import RankCertFile, resolve_rank_cert
from vnetd.model import Member
from vnetd.registry.base import KeyValue
from vnetd.spec import MeshSpec, parse_spec

CA = Signer.generate()
OTHER_CA = Signer.generate()
HOLDER = Signer.generate()
THIEF = Signer.generate()
WG_KEY = base64.b64encode(b"w" * 32).decode()
NOW = time.time()


def spec_of(rank_ca: list[str] | None = None, name: str = "m") -> MeshSpec:
    mesh: dict[str, object] = {"name": name, "size": 16, "network": "10.0.0.0/24"}
    if rank_ca is not None:
        mesh["rank_ca"] = rank_ca
    return parse_spec({"mesh": mesh})


SPEC = spec_of([OTHER_CA.public_key, CA.public_key])


def cert_der(
    uris: list[str],
    *,
    ca: object = CA.private_key,
    key: str = HOLDER.public_key,
    start: float = NOW - 60,
    days: float = 1,
) -> bytes:
    """A certificate built as the csi-driver or ``rank_cert.issue`` would, but with any
    URI SANs, issuer key (an ECDSA one too) and validity."""
    begin = datetime.fromtimestamp(start, UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ca")]))
        .public_key(Ed25519PublicKey.from_public_bytes(base64.b64decode(key)))
        .serial_number(1)
        .not_valid_before(begin)
        .not_valid_after(begin + timedelta(days=days))
    )
    if uris:
        sans = [x509.UniformResourceIdentifier(u) for u in uris]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=True)
    algorithm = SHA256() if isinstance(ca, ec.EllipticCurvePrivateKey) else None
    return builder.sign(ca, algorithm).public_bytes(Encoding.DER)  # type: ignore[arg-type]


def b64(der: bytes) -> str:
    return base64.b64encode(der).decode()


RANK3 = b64(rank_cert.issue(CA, HOLDER.public_key, rank_cert.rank_uri("m", 3), days=1))


@pytest.mark.parametrize(
    ("rank", "cert", "why"),
    [
        pytest.param(3, RANK3, None, id="rank-uri"),
        pytest.param(3, b64(cert_der(["vnetd://m/ns/m-3/uid-1"])), None, id="statefulset-pod"),
        pytest.param(3, b64(cert_der(["vnetd://m/ns/m-3-x7k2q/u"])), None, id="job-pod"),
        pytest.param(3, b64(cert_der(["spiffe://a/b", "vnetd://m/rank/3"])), None, id="other-uri"),
        pytest.param(3, b64(cert_der(["vnetd://m/rank/3"], ca=OTHER_CA.private_key)), None,
                     id="second-ca"),
        pytest.param(4, RANK3, r"names rank 3, not rank 4 \(m-4\)", id="wrong-rank"),
        pytest.param(3, b64(cert_der(["vnetd://m/ns/m-33/u"])), r"names pod ns/m-33, not rank 3",
                     id="pod-of-rank-33"),
        pytest.param(3, b64(cert_der(["vnetd://m/ns/m-3-X7K2Q/u"])), "names pod ns/m-3-X7K2Q",
                     id="upper-suffix"),
        pytest.param(3, b64(cert_der(["vnetd://m/ns/m-3-x7k2/u"])), "names pod", id="short-suffix"),
        pytest.param(3, b64(cert_der(["vnetd://n/rank/3"])), "is for mesh 'n', not 'm'",
                     id="wrong-mesh"),
        pytest.param(3, b64(cert_der(["vnetd://m/rank/3"], ca=Signer.generate().private_key)),
                     "not signed by a CA of mesh.rank_ca", id="wrong-ca"),
        pytest.param(3, b64(cert_der(["vnetd://m/rank/3"], ca=ec.generate_private_key(
            ec.SECP256R1()))), "not signed with Ed25519", id="ecdsa-ca"),  # fmt: skip
        pytest.param(3, b64(cert_der(["vnetd://m/rank/3"], key=THIEF.public_key)),
                     "vouches for signing key", id="key-mismatch"),
        pytest.param(3, b64(cert_der(["vnetd://m/rank/3"], start=NOW - 3 * 86400)), "expired at",
                     id="expired"),
        pytest.param(3, b64(cert_der(["vnetd://m/rank/3"], start=NOW + 3600)), "valid only from",
                     id="not-yet"),
        pytest.param(3, b64(cert_der(["vnetd://m/rank/3"], start=NOW + 30)), None,
                     id="within-skew"),
        pytest.param(3, b64(cert_der([])), "has no URI SAN", id="no-san"),
        pytest.param(3, b64(cert_der(["vnetd://m/rank/3", "vnetd://m/rank/4"])), "has 2 URI SANs",
                     id="two-sans"),
        pytest.param(3, b64(cert_der(["vnetd://m/rank/03"])), "names no rank and no pod",
                     id="padded-rank"),
        pytest.param(3, b64(b"\x30\x03junk"), "not an X.509 certificate", id="malformed-der"),
        pytest.param(3, b64(rank_cert.issue(CA, HOLDER.public_key, "vnetd://m/rank/3",
                                            days=1))[:-8], "not", id="truncated"),
        pytest.param(3, "not base64!", "is not base64", id="not-base64"),
        pytest.param(3, "", "carries no field cert", id="no-cert"),
    ],
)  # fmt: skip
def test_a_record_is_vouched_for_only_by_a_pinned_ca_for_its_rank(
    rank: int, cert: str, why: str | None
) -> None:
    found = rank_cert.refusal(SPEC, rank, HOLDER.public_key, cert, cache=rank_cert.CertCache())
    if why is None:
        assert found is None
    else:
        assert found is not None
        assert re.search(why, found), found


def test_a_certificate_is_verified_once_then_only_looked_up() -> None:
    cache = rank_cert.CertCache()
    for _ in range(5):
        assert rank_cert.refusal(SPEC, 3, HOLDER.public_key, RANK3, cache=cache) is None
    assert cache.verified == 1
    # The cached facts still answer rank, key and expiry each time.
    assert rank_cert.refusal(SPEC, 4, HOLDER.public_key, RANK3, cache=cache) is not None
    assert rank_cert.refusal(SPEC, 3, THIEF.public_key, RANK3, cache=cache) is not None
    late = NOW + 2 * 86400
    assert "expired" in str(rank_cert.refusal(SPEC, 3, HOLDER.public_key, RANK3, now=late,
                                              cache=cache))  # fmt: skip
    assert cache.verified == 1
    # Another pinned set is another question: verified again.
    other = spec_of([CA.public_key])
    assert rank_cert.refusal(other, 3, HOLDER.public_key, RANK3, cache=cache) is None
    assert cache.verified == 2


def test_the_cache_is_bounded() -> None:
    cache = rank_cert.CertCache()
    for rank in range(rank_cert.CACHE_MIN + 10):
        der = cert_der([f"vnetd://m/rank/{rank}"], start=NOW - rank)
        rank_cert.refusal(SPEC, 3, HOLDER.public_key, b64(der), cache=cache)
    assert len(cache) == rank_cert.CACHE_MIN


def test_without_rank_ca_no_certificate_is_asked_for() -> None:
    assert rank_cert.refusal(spec_of(), 3, "", "", cache=rank_cert.CertCache()) is None
    unsigned = rank_cert.refusal(SPEC, 3, "", RANK3, cache=rank_cert.CertCache())
    assert unsigned is not None and unsigned.startswith("unsigned")


def record(spec: MeshSpec, rank: int, signer: Signer, cert: str, lease: int = 7) -> bytes:
    member = Member(rank, WG_KEY, "198.18.0.9:51820", "pod", signing_key=signer.public_key,
                    cert=cert)  # fmt: skip
    return encode_member(member, signer, key=member_key(spec, rank), lease=lease)


@pytest.mark.parametrize(
    ("signer", "cert", "fault"),
    [
        pytest.param(THIEF, "", "carries no field cert", id="own-key-no-cert"),
        pytest.param(
            THIEF,
            b64(cert_der(["vnetd://m/rank/1"])),
            "vouches for signing key",
            id="holders-cert-own-key",
        ),
        pytest.param(
            THIEF,
            b64(
                cert_der(
                    ["vnetd://m/rank/1"], key=THIEF.public_key, ca=Signer.generate().private_key
                )
            ),
            "not signed by a CA",
            id="another-ca",
        ),  # fmt: skip
        pytest.param(
            THIEF,
            b64(cert_der(["vnetd://m/rank/2"], key=THIEF.public_key)),
            "names rank 2, not rank 1",
            id="rank-2-cert",
        ),
    ],
)
def test_a_thief_with_the_etcd_credential_writes_no_member(
    signer: Signer, cert: str, fault: str
) -> None:
    """Each of the e2e test's forgeries at rank 1, as a reader's codec sees it."""
    with pytest.raises(BadEntry, match=f"members/1: .*{fault}"):
        decode_member(SPEC, member_key(SPEC, 1), record(SPEC, 1, signer, cert), 7)


def test_a_vouched_record_decodes_with_its_cert_and_the_proof_still_decides() -> None:
    cert = b64(cert_der(["vnetd://m/rank/1"]))
    value = record(SPEC, 1, HOLDER, cert)
    member = decode_member(SPEC, member_key(SPEC, 1), value, 7)
    assert member.cert == cert and member.signing_key == HOLDER.public_key
    with pytest.raises(BadEntry, match="proof does not verify"):
        decode_member(SPEC, member_key(SPEC, 1), value.replace(b"pod", b"pod2"), 7)
    with pytest.raises(BadEntry, match="field cert is not a string"):
        decode_member(SPEC, member_key(SPEC, 1), value.replace(b'"cert":"', b'"cert":7,"x":"'), 7)
    assert b'"cert"' not in record(spec_of(), 1, HOLDER, "")  # left out when empty


def test_a_vouched_claimant_takes_over_an_entry_readers_refuse() -> None:
    me = Member(1, WG_KEY, None, "pod", signing_key=HOLDER.public_key)
    entry = KeyValue("k", b"x", 5, 5, lease=9)
    assert (_replaceable(entry, None, me, 0, _VOUCHED) or "").startswith(_VOUCHED)
    other = Member(1, WG_KEY, None, "old-pod", signing_key=THIEF.public_key, cert=RANK3)
    assert _replaceable(entry, other, me, 0, _VOUCHED) is None  # vouched for too: held


def test_a_daemon_refuses_to_start_with_a_certificate_readers_would_refuse() -> None:
    rank_cert.check_own_cert(SPEC, 3, HOLDER.public_key, RANK3, "--rank-cert-file c")
    with pytest.raises(
        IdentityError,
        match=r"^rank 4: the spec pins mesh.rank_ca, and this "
        r"record \(--rank-cert-file c\) field cert names rank 3, not rank 4",
    ):
        rank_cert.check_own_cert(SPEC, 4, HOLDER.public_key, RANK3, "--rank-cert-file c")
    with pytest.raises(IdentityError, match=r"\(give --rank-cert-file FILE\) carries no field"):
        rank_cert.check_own_cert(SPEC, 4, HOLDER.public_key, "", "")
    rank_cert.check_own_cert(spec_of(), 4, HOLDER.public_key, "", "")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param([], r"^mesh.rank_ca: empty; list the rank CA's public key", id="empty"),
        pytest.param("x", r"^mesh.rank_ca: expected an array, got a string", id="not-list"),
        pytest.param([1], r"^mesh.rank_ca\[0\]: expected a string, got an integer", id="int"),
        pytest.param(["abc"], r"^mesh.rank_ca\[0\]: 'abc' is not an Ed25519 public key: give "
                     r"the rank CA's \(base64 of 32 bytes\), as `vnetd rank-ca", id="not-key"),
        pytest.param([CA.public_key, CA.public_key], r"^mesh.rank_ca\[1\]: .* is listed twice",
                     id="twice"),
    ],
)  # fmt: skip
def test_the_spec_names_a_bad_rank_ca(value: object, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_spec({"mesh": {"name": "m", "size": 4, "network": "10.0.0.0/24", "rank_ca": value}})


def test_rank_ca_is_part_of_the_stored_spec() -> None:
    assert SPEC.mesh_table()["rank_ca"] == [OTHER_CA.public_key, CA.public_key]
    assert SPEC.differing_keys(spec_of().canonical_json()) == ["rank_ca"]
    assert "rank_ca" not in spec_of().mesh_table()  # older meshes compare equal


def test_a_csi_driver_key_file_signs(tmp_path: Path) -> None:
    """cert-manager's csi-driver writes ``tls.key`` as PKCS8 PEM, mode 0440."""
    path = tmp_path / "tls.key"
    pem = HOLDER.private_key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    path.write_bytes(pem)
    path.chmod(0o440)
    assert load_signer(path).public_key == HOLDER.public_key
    path.chmod(0o444)
    with pytest.raises(IdentityError, match="mode 0444 lets others read"):
        load_signer(path)
    base64_key = tmp_path / "signing.key"  # the group may read only the csi-driver's PEM
    base64_key.write_text(base64.b64encode(HOLDER.private_bytes()).decode())
    base64_key.chmod(0o440)
    with pytest.raises(IdentityError, match="mode 0440 lets others read"):
        load_signer(base64_key)
    path.chmod(0o600)
    path.write_bytes(ec.generate_private_key(ec.SECP256R1()).private_bytes(
        Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))  # fmt: skip
    with pytest.raises(IdentityError, match="not a base64 Ed25519 private key"):
        load_signer(path)


def test_the_rank_cert_file_is_read_once_as_der_or_pem(tmp_path: Path) -> None:
    der = base64.b64decode(RANK3)
    pem = tmp_path / "tls.crt"
    block = base64.encodebytes(der).decode()
    pem.write_text(f"-----BEGIN CERTIFICATE-----\n{block}-----END CERTIFICATE-----\n")
    (tmp_path / "c.der").write_bytes(der)
    assert resolve_rank_cert(str(pem), {}, SPEC) == RankCertFile(
        f"--rank-cert-file {pem}", pem, RANK3
    )
    env = {"VNETD_RANK_CERT_FILE": str(tmp_path / "c.der")}
    found = resolve_rank_cert(None, env, SPEC)
    assert found is not None and found.cert == RANK3
    assert found.named == f"VNETD_RANK_CERT_FILE {tmp_path}/c.der"
    assert resolve_rank_cert(None, {}, SPEC) is None
    with pytest.raises(IdentityError, match=r"^--rank-cert-file .*/nope: cannot read the rank"):
        resolve_rank_cert(str(tmp_path / "nope"), {}, SPEC)


def test_rank_ca_and_rank_cert_issue_what_readers_take(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ca_key = tmp_path / "ca.key"
    assert main(["rank-ca", "--create", "--key-file", str(ca_key)]) == 0
    ca_public = capsys.readouterr().out.strip()
    spec_path = tmp_path / "mesh.toml"
    spec_path.write_text(
        f'[mesh]\nname = "m"\nsize = 4\nnetwork = "10.0.0.0/24"\nrank_ca = ["{ca_public}"]\n'
    )
    out = tmp_path / "r2.der"
    argv = ["rank-cert", "--config", str(spec_path), "--ca-key", str(ca_key), "--rank", "2",
            "--signing-key", HOLDER.public_key, "-o", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert capsys.readouterr().out.strip() == "vnetd://m/rank/2"
    spec = parse_spec({"mesh": {"name": "m", "size": 4, "network": "10.0.0.0/24",
                                "rank_ca": [ca_public]}})  # fmt: skip
    cert = b64(out.read_bytes())
    assert rank_cert.refusal(spec, 2, HOLDER.public_key, cert) is None
    assert main(argv) == 2  # never over a file
    assert "exists; name a new file" in capsys.readouterr().err
    other = tmp_path / "other.key"
    main(["rank-ca", "--create", "--key-file", str(other)])
    argv[4], argv[-1] = str(other), str(tmp_path / "x.der")
    assert main(argv) == 2
    assert "is not in mesh.rank_ca" in capsys.readouterr().err


def test_vnetd_up_resolves_its_certificate_once_and_refuses_one_readers_would(
    tmp_path: Path,
) -> None:
    """``--rank-cert-file`` (else the variable, else the spec key) is read in the settings
    layer; the record carries it; a daemon whose pair readers would refuse exits 2."""
    from vnetd.cli import build_parser
    from vnetd.commands import up
    from vnetd.daemon.root import prepare
    from vnetd.daemon_settings import DaemonSettings

    key_file = tmp_path / "sign.key"
    key_file.write_text(base64.b64encode(HOLDER.private_bytes()).decode() + "\n")
    key_file.chmod(0o600)
    (tmp_path / "r1.der").write_bytes(base64.b64decode(b64(cert_der(["vnetd://m/rank/1"]))))
    config = tmp_path / "mesh.toml"
    config.write_text(f'[mesh]\nname = "m"\nsize = 4\nnetwork = "10.0.0.0/24"\n'
                      f'rank_ca = ["{CA.public_key}"]\n[wireguard]\n'
                      f'rank_cert_file = "{tmp_path}/r1.der"\n')  # fmt: skip

    def settings(rank: str, *flags: str) -> DaemonSettings:
        argv = ["up", "--config", str(config), "--rank", rank, "--endpoint", "198.18.0.9:1",
                "--state-dir", str(tmp_path / "state"), "--signing-key-file", str(key_file),
                *flags]  # fmt: skip
        return up.daemon_settings(build_parser().parse_args(argv), {})

    resolved = settings("1")
    me, _config, _signer = prepare(resolved, 1)
    assert me.cert == b64((tmp_path / "r1.der").read_bytes())
    assert resolved.rank_cert is not None
    assert resolved.rank_cert.named == f"wireguard.rank_cert_file {tmp_path}/r1.der"
    with pytest.raises(IdentityError, match=r"^rank 2: .*\(wireguard.rank_cert_file .*\) field "
                       "cert names rank 1, not rank 2"):  # fmt: skip
        prepare(settings("2"), 2)
    with pytest.raises(IdentityError, match=r"^--rank-cert-file .*/none: cannot read"):
        settings("1", "--rank-cert-file", str(tmp_path / "none"))


class FakeClaim:
    def __init__(self, me: Member) -> None:
        self.me = me
        self.set: list[str] = []

    def set_cert(self, cert: str) -> None:
        self.set.append(cert)
        self.me = dataclasses.replace(self.me, cert=cert)


async def test_a_renewed_certificate_is_carried_and_a_bad_one_kept_out(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The csi-driver renews ``tls.crt`` in place: the daemon carries the new one once
    it would be accepted; an unreadable file or a certificate readers would refuse is
    logged once and the carried one kept."""
    carried = b64(cert_der(["vnetd://m/rank/1"]))
    renewed = b64(cert_der(["vnetd://m/rank/1"], start=NOW))
    other_rank = b64(cert_der(["vnetd://m/rank/2"], start=NOW))
    claim = FakeClaim(Member(1, WG_KEY, None, "pod", signing_key=HOLDER.public_key, cert=carried))
    file: list[str | OSError] = [carried, OSError(2, "No such file"), other_rank, other_rank,
                                 renewed, renewed]  # fmt: skip

    def read() -> str:
        value = file.pop(0) if len(file) > 1 else file[0]
        if isinstance(value, OSError):
            raise value
        return value

    caplog.set_level(logging.INFO, "vnetd.claim")
    monkeypatch.setattr(rank_cert, "RANK_CERT_POLL", 0.001)  # real time: the read is a thread's
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(rank_cert.follow_rank_cert, read, "--rank-cert-file F", SPEC, claim)
            while len(file) > 1 or not claim.set:
                await trio.sleep(0.01)
            await trio.sleep(0.05)  # a few more reads of the same file
            nursery.cancel_scope.cancel()
    assert claim.set == [renewed]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        "rank 1: --rank-cert-file F: No such file; keeping the certificate carried",
        "rank 1: --rank-cert-file F: field cert names rank 2, not rank 1 (m-1); keeping the "
        "certificate carried",
    ]
    assert any("rank certificate renewed from --rank-cert-file F (valid until" in r.getMessage()
               for r in caplog.records)  # fmt: skip
