"""Throwaway X.509 certificates for TLS tests: a CA, server and client certificates."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DAY = datetime.timedelta(days=1)


@dataclass(frozen=True)
class CertFiles:
    cert: Path
    key: Path


class TestCA:
    """A CA that writes PEM files into ``directory``."""

    __test__ = False  # not a pytest class

    def __init__(self, directory: Path, name: str = "vnetd-test-ca") -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.name = subject
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - DAY)
            .not_valid_after(now + 30 * DAY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )  # fmt: skip
            .sign(self.key, hashes.SHA256())
        )
        self.ca_file = directory / f"{name}.pem"
        self.ca_file.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(
        self,
        name: str,
        *,
        ips: tuple[str, ...] = (),
        expired: bool = False,
        common_name: bool = True,
    ) -> CertFiles:
        """A certificate for ``name`` (CN) valid for server and client auth, with IP SANs.

        ``common_name`` False: an empty subject and ``name`` as a DNS SAN instead (etcd
        3.4's JSON gateway refuses a client certificate with a CN once auth is on).
        """
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        start, end = (now - 10 * DAY, now - DAY) if expired else (now - DAY, now + 30 * DAY)
        builder = (
            x509.CertificateBuilder()
            .subject_name(
                x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)] if common_name else [])
            )
            .issuer_name(self.name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
        )
        sans: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        if not common_name:
            sans.append(x509.DNSName(name))
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        files = CertFiles(self.directory / f"{name}.crt", self.directory / f"{name}.key")
        files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        files.key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        files.key.chmod(0o600)
        return files
