"""``vnetd rank-ca`` and ``vnetd rank-cert``: a mesh's rank CA, and a rank certificate
for a plain host (and the tests).

A spec that pins rank CAs (``[mesh] rank_ca``) takes a record at rank k only with a
certificate from one of them for k (``control.rank_cert``). In Kubernetes,
cert-manager's csi-driver issues each pod its own; a host without it gets one here:
``vnetd rank-ca --create --key-file ca.key`` makes the CA's key (0600, as
``vnetd signing-key`` does) and prints the value to pin; ``vnetd rank-cert`` signs
the host's record signing public key (``vnetd signing-key`` prints it: the CA's
holder never sees the host's private key) for one rank, URI SAN
``vnetd://<mesh>/rank/<k>``, and writes it as DER for ``vnetd up --rank-cert-file``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from vnetd.errors import IdentityError

DEFAULT_DAYS = 365.0


def add_parser(sub: Any) -> None:  # noqa: ANN401 (argparse's private subparsers type)
    ca = sub.add_parser(
        "rank-ca",
        help="print (or make) a rank CA's public key, the value [mesh] rank_ca pins",
        description="Print the base64 Ed25519 public key of a rank CA's key file: the "
        "value to list in [mesh] rank_ca. The private key is never printed.",
    )
    ca.add_argument(
        "--key-file",
        type=Path,
        required=True,
        help="the CA's key (signing.key's format, or a PKCS8 PEM Ed25519 key such as a "
        "cert-manager CA Secret's tls.key)",
    )
    ca.add_argument(
        "--create", action="store_true", help="make a new key file (0600; never over a file)"
    )
    ca.set_defaults(run=run_ca)
    cert = sub.add_parser(
        "rank-cert",
        help="issue a rank certificate for a host's record signing key",
        description="Sign a record signing public key for one rank with a rank CA: an "
        "X.509 certificate (DER) with URI SAN vnetd://MESH/rank/RANK, for vnetd up "
        "--rank-cert-file.",
    )
    cert.add_argument("--config", type=Path, required=True, help="the mesh's spec (TOML)")
    cert.add_argument("--ca-key", type=Path, required=True, help="the CA's key file")
    cert.add_argument("--rank", type=int, required=True, help="the rank it vouches for")
    key = cert.add_mutually_exclusive_group(required=True)
    key.add_argument(
        "--signing-key", metavar="PUBLIC_KEY", help="the holder's public key (vnetd signing-key)"
    )
    key.add_argument(
        "--signing-key-file", type=Path, metavar="FILE", help="the holder's signing key file"
    )
    cert.add_argument(
        "--days", type=float, default=DEFAULT_DAYS, help=f"validity (default {DEFAULT_DAYS:g})"
    )
    cert.add_argument("-o", "--out", type=Path, required=True, help="the new file (DER)")
    cert.set_defaults(run=run_cert)


def run_ca(args: argparse.Namespace) -> int:
    """Print the CA's public key; 0. Errors are ``IdentityError`` (exit 2)."""
    from vnetd.control.proof import create_signer_file, load_signer

    create = create_signer_file if args.create else load_signer
    print(create(args.key_file, "--key-file").public_key)
    return 0


def run_cert(args: argparse.Namespace) -> int:
    """Write the certificate and print its URI SAN; 0. Errors are ``VnetdError`` (exit 2)."""
    from vnetd.control.proof import load_signer
    from vnetd.control.rank_cert import issue, rank_uri
    from vnetd.model import check_public_key
    from vnetd.spec import load_spec

    spec = load_spec(args.config)
    spec.check_rank(args.rank)
    ca = load_signer(args.ca_key, "--ca-key")
    if ca.public_key not in spec.rank_ca:
        raise IdentityError(
            f"--ca-key {args.ca_key}: its key {ca.public_key[:12]!r} is not in mesh.rank_ca "
            f"of {args.config}; pin it there first (vnetd rank-ca --key-file FILE prints it)"
        )
    if args.signing_key_file is not None:
        holder = load_signer(args.signing_key_file, "--signing-key-file").public_key
    else:
        try:
            holder = check_public_key(args.signing_key)
        except ValueError as exc:
            raise IdentityError(f"--signing-key: {exc}") from None
    if not args.days > 0:
        raise IdentityError(f"--days: {args.days:g} is not a positive number of days")
    uri = rank_uri(spec.name, args.rank)
    der = issue(ca, holder, uri, days=args.days)
    try:
        with args.out.open("xb") as out:
            out.write(der)
    except FileExistsError:
        raise IdentityError(f"--out {args.out}: exists; name a new file") from None
    except OSError as exc:
        raise IdentityError(f"--out {args.out}: cannot write: {exc.strerror}") from None
    print(uri)
    return 0
