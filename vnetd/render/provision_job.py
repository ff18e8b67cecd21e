"""The Job that makes a mesh's etcd users and turns etcd's auth on: ``vnetd render
provision`` (docs/kubernetes.md, "etcd with auth on").

One Job per mesh, beside the mesh's ``vnetd render manifests`` output: it runs
``vnetd provision --enable-auth`` as etcd's root with the spec from the mesh's
ConfigMap, so the mesh user the spec names (``registry.username``) exists, with the
roles ``vnetd provision`` gives it, before auth is on; and if auth is on already (the
Job ``etcd-auth`` of manifests/etcd came first), it makes the users as root. Both
Jobs are idempotent and wait for etcd (``--wait``).

The passwords: root's from the Secret ``etcd-root`` (key ``password``), the mesh
user's from the Secret the daemons mount it from (``secretfiles.ETCD_PASSWORD_SECRET``,
key: the file's name), mounted here as ``--passwords``: ``vnetd provision`` uses a
file there that is named after the user as that user's password, so the spec's
``registry.password_file`` must be named after ``registry.username``. The operator
creates both Secrets; the Job writes none (the mount is read-only).

Pure: dictionaries only.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from vnetd.errors import SpecError
from vnetd.render.manifests import (
    DEFAULT_IMAGE,
    JOB_TTL_AFTER_FINISHED,
    Obj,
    check_image,
    manifest_objects_header,
    yaml_stream,
)
from vnetd.render.pods import (
    CONFIG_DIR,
    ETCD_CLIENT_SECRET,
    RUNTIME_DEFAULT_SECCOMP,
    SPEC_KEY,
    config_name,
    etcd_tls_dir,
    resources,
)
from vnetd.render.secretfiles import ETCD_PASSWORD_SECRET
from vnetd.spec import MeshSpec

ROOT_SECRET = "etcd-root"
"""The Secret with etcd root's password (key ``ROOT_KEY``); the operator creates it."""
ROOT_KEY = "password"
ROOT_DIR = "/etc/etcd-root"
WAIT_SECONDS = 600
"""How long the Job waits for etcd to answer and take root's password (10 minutes)."""
JOB_USER = 10001
"""The image's own user (Dockerfile ``USER``): the Job needs no privilege."""


def render_provision(
    spec: MeshSpec, image: str = DEFAULT_IMAGE, relay_user: str | None = None
) -> str:
    """The provisioning Job of ``spec``'s mesh as a YAML stream ending in a newline;
    ``relay_user``: also the relays' read-only user (``render manifests --relays``), its
    password the Secret's key of that name.

    Raises:
        SpecError: the spec names no mesh user or password file, or a file the Job
            cannot find by the user's name (naming the key), or ``image`` is no image.
    """
    header = manifest_objects_header(
        spec,
        "the Job that makes its etcd users",
        "vnetd render provision",
        "the spec in its ConfigMap",
    )
    return header + yaml_stream([provision_job(spec, check_image(image), relay_user)])


def job_name(spec: MeshSpec) -> str:
    return f"{config_name(spec)}-provision"


def passwords_dir(spec: MeshSpec) -> str:
    """The directory of ``registry.password_file``, whose file is the mesh user's.

    Raises:
        SpecError: no user or no password file, or the file is not named after the user.
    """
    user, path = spec.registry.username, spec.registry.password_file
    if user is None or path is None:
        raise SpecError(
            "registry.username: the mesh's daemons need an etcd user once auth is on; set "
            f'username = "vnetd-{spec.name}" and password_file = '
            f'"/etc/{ETCD_PASSWORD_SECRET}/vnetd-{spec.name}" in [registry]'
        )
    file = PurePosixPath(path)
    if file.name != user:
        raise SpecError(
            f"registry.password_file: {path!r}: the provisioning Job finds user {user!r}'s "
            f"password by the user's name; name the file {file.parent / user}"
        )
    return str(file.parent)


def provision_job(spec: MeshSpec, image: str, relay_user: str | None = None) -> Obj:
    """The Job object (the module's docstring)."""
    passwords = passwords_dir(spec)
    tls_dir = etcd_tls_dir(spec, (CONFIG_DIR, ROOT_DIR, passwords))
    args = ["provision", "--config", f"{CONFIG_DIR}/{SPEC_KEY}", "--enable-auth",
            "--etcd-user", "root", "--etcd-password-file", f"{ROOT_DIR}/{ROOT_KEY}",
            "--passwords", passwords, "--wait", str(WAIT_SECONDS)]  # fmt: skip
    if relay_user is not None:
        args += ["--relay-user", relay_user]
    mounts = [
        {"name": "vnetd-config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "etcd-root", "mountPath": ROOT_DIR, "readOnly": True},
        {"name": "mesh-passwords", "mountPath": passwords, "readOnly": True},
    ]
    volumes: list[Obj] = [
        {"name": "vnetd-config", "configMap": {"name": config_name(spec),
                                               "items": [{"key": SPEC_KEY, "path": SPEC_KEY}]}},
        _secret("etcd-root", ROOT_SECRET),
        _secret("mesh-passwords", ETCD_PASSWORD_SECRET),
    ]  # fmt: skip
    if tls_dir is not None:
        mounts.append({"name": "etcd-client-tls", "mountPath": tls_dir, "readOnly": True})
        volumes.append(_secret("etcd-client-tls", ETCD_CLIENT_SECRET))
    labels = {
        "app.kubernetes.io/name": "vnetd-provision",
        "app.kubernetes.io/instance": spec.name,
        "app.kubernetes.io/part-of": "vnetd",
    }
    container = {
        "name": "provision",
        "image": image,
        "args": args,
        "resources": resources("10m", "32Mi", "128Mi"),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": mounts,
    }
    pod = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": JOB_USER,
            "runAsGroup": JOB_USER,
            "fsGroup": JOB_USER,
            **RUNTIME_DEFAULT_SECCOMP,
        },
        "containers": [container],
        "volumes": volumes,
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": job_name(spec), "labels": labels},
        "spec": {
            "backoffLimit": 6,
            "ttlSecondsAfterFinished": JOB_TTL_AFTER_FINISHED,
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


def _secret(name: str, secret: str) -> Obj:
    """A Secret volume readable by the Job's group only (fsGroup)."""
    return {"name": name, "secret": {"secretName": secret, "defaultMode": 0o440}}
