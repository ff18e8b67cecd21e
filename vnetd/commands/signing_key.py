"""``vnetd signing-key``: print a record signing public key, the value a spec pins.

A gateway rank's signing key is pinned in the spec (``[sites.<name>]
gateway_keys``, docs/spec.md); this prints the public half of the key a
daemon or ``vnetd register`` keeps in its state dir (``signing.key``), or of a
key file in that format, so an operator can copy it into the spec. With
``--create`` a state dir that has no key yet gets one first (0600 in a 0700
directory), or a new key file is made (0600, never over an existing file: a
spec may pin its key), so a gateway's key can be made and pinned before it
ever starts, and kept in a Secret that outlives its pods
(``vnetd up --signing-key-file``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from vnetd.errors import IdentityError


def add_parser(sub: Any) -> None:  # noqa: ANN401 (argparse's private subparsers type)
    parser = sub.add_parser(
        "signing-key",
        help="print the record signing public key of a state dir or key file",
        description="Print the base64 Ed25519 public key that signs a daemon's member "
        "records: the value to pin in [sites.NAME] gateway_keys. The private key is "
        "never printed.",
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--state-dir", type=Path, help="a daemon's state dir (its signing.key is read)"
    )
    where.add_argument(
        "--key-file",
        type=Path,
        help="a signing key file (signing.key's format), as vnetd up --signing-key-file takes",
    )
    parser.add_argument(
        "--create",
        action="store_true",
        help="with --state-dir: make the key first if the directory has none; with "
        "--key-file: make a new key file (0600; an existing file is refused)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Print the public key; 0. Errors are ``IdentityError`` (exit 2)."""
    from vnetd.commands.register import signer_in
    from vnetd.control.proof import SIGNING_KEY_FILE, create_signer_file, load_signer

    if args.key_file is not None:
        create = create_signer_file if args.create else load_signer
        signer = create(args.key_file, "--key-file")
    elif args.create:
        signer = signer_in(args.state_dir)  # the key vnetd register keeps there
    else:
        path = args.state_dir / SIGNING_KEY_FILE
        if not path.exists():
            raise IdentityError(
                f"--state-dir: {path} does not exist; start the daemon once with this "
                "state dir, or add --create to make the key now"
            )
        signer = load_signer(path)
    print(signer.public_key)
    return 0
