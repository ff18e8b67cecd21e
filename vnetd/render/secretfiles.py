"""The Secrets a spec names by file: where the rendered pods get each file from.

``[wireguard] preshared_key_file`` and ``registry.password_file`` are paths
inside the vnetd container. The renderers mount each from a Secret of a fixed
name (``PRESHARED_KEY_SECRET``, ``ETCD_PASSWORD_SECRET``) whose key is the file's
name, or refuse the spec with one line naming the key, the Secret and the fix; a
spec naming no such file mounts nothing. The etcd TLS files are the other Secret
(``pods.etcd_tls_dir``).

``render manifests`` mounts each file by ``subPath`` at its path, mode 0400.
The Flux Operator mounts Secrets 0644 and lets a MiniCluster choose neither
mode nor ``subPath``, and vnetd refuses a pre-shared key others can read: a
MiniCluster mounts each Secret under ``STAGING_DIR`` and its vnetd command
copies the file to its path as a 0400 file first (``copy_commands``).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from vnetd.errors import SpecError
from vnetd.spec import MeshSpec

Obj = dict[str, Any]

PRESHARED_KEY_SECRET = "vnetd-preshared-key"
"""The Secret holding ``[wireguard] preshared_key_file`` (its key: the file's name)."""
ETCD_PASSWORD_SECRET = "vnetd-etcd-password"
"""The Secret holding ``registry.password_file`` (its key: the file's name)."""
GATEWAY_KEYS_SECRET = "vnetd-gateway-signing-keys"
"""The Secret with the pinned gateways' signing keys, ``gateway-<rank>.key`` each
(``vnetd signing-key --create --key-file gateway-<rank>.key`` makes one), copied
into a gateway pod's state dir (``site_manifests``), never named by the spec."""
STAGING_DIR = "/run/vnetd-secrets"
"""A MiniCluster's read-only Secret mounts, one directory per Secret, copied from."""


@dataclass(frozen=True)
class SecretFile:
    """A file the spec names and the Secret it comes from."""

    key: str
    """The spec key that names it, e.g. ``wireguard.preshared_key_file``."""
    path: PurePosixPath
    secret: str

    @property
    def item(self) -> str:
        """The Secret's key: the file's name."""
        return self.path.name

    @property
    def staged(self) -> str:
        """Where a MiniCluster mounts it before the copy."""
        return f"{STAGING_DIR}/{self.secret}/{self.item}"


def secret_files(spec: MeshSpec, taken: tuple[str, ...]) -> list[SecretFile]:
    """The files the spec names, each with its Secret; ``taken`` are directories the
    pods mount already (a file cannot be put under them).

    Raises:
        SpecError: a path is relative, or under a directory in ``taken``; the
            message names the key and the Secret to create. A spec naming a
            signing key file (one rank's key, not a file for every pod).
    """
    if spec.local.signing_key_file:
        raise SpecError(
            f"wireguard.signing_key_file: {spec.local.signing_key_file!r} would be one file for "
            "every pod rendered, and a signing key is one rank's; the manifests copy each "
            f"pinned gateway's own key from the Secret {GATEWAY_KEYS_SECRET} (docs/bursting.md, "
            '"Pinned gateways"): drop this key from the spec you render'
        )
    named = [
        ("wireguard.preshared_key_file", spec.local.preshared_key_file, PRESHARED_KEY_SECRET),
        ("registry.password_file", spec.registry.password_file, ETCD_PASSWORD_SECRET),
    ]
    files = []
    for key, value, secret in named:
        if not value:
            continue
        path = PurePosixPath(value)
        fix = (
            f"the pods mount it from the Secret {secret} (key {path.name!r}); give an "
            f"absolute path outside {', '.join(taken)}, such as /etc/{secret}/{path.name}"
        )
        if not path.is_absolute() or path.name in ("", ".", ".."):
            raise SpecError(f"{key}: {value!r} is not an absolute file path: {fix}")
        if any(path.is_relative_to(directory) for directory in taken):
            raise SpecError(f"{key}: {value!r} is under a directory vnetd mounts already: {fix}")
        files.append(SecretFile(key, path, secret))
    return files


def with_secret_files(files: list[SecretFile], container: Obj, volumes: list[Obj]) -> None:
    """``render manifests``: mount each file at its path from its Secret, mode 0400."""
    for file in files:
        container["volumeMounts"].append(
            {"name": file.secret, "mountPath": str(file.path), "subPath": file.item,
             "readOnly": True}
        )  # fmt: skip
        volumes.append(
            {
                "name": file.secret,
                "secret": {
                    "secretName": file.secret,
                    "defaultMode": 0o400,
                    "items": [{"key": file.item, "path": file.item}],
                },
            }
        )


def staged_volumes(files: list[SecretFile]) -> Obj:
    """A MiniCluster container's ``volumes`` entries: each Secret under ``STAGING_DIR``."""
    return {
        file.secret: {"secretName": file.secret, "path": f"{STAGING_DIR}/{file.secret}",
                      "readOnly": True}
        for file in files
    }  # fmt: skip


def copy_commands(files: list[SecretFile]) -> list[str]:
    """Shell lines that copy each staged file to its path, 0400 (``install`` is coreutils')."""
    return [
        f"install -D -m 0400 {shlex.quote(file.staged)} {shlex.quote(str(file.path))}"
        for file in files
    ]
