"""The image recipe, checked by reading: no container engine runs here.

* ``Dockerfile``: the base pinned by a digest the build must be given, OCI
  labels, the locked dependencies installed without resolving, the
  wireguard-go version the tests run checked at build time.
* ``requirements.lock``: exactly the closure of ``[project] dependencies``,
  each pinned to a version that satisfies them.
* ``.dockerignore``: the build context holds the package and nothing else:
  no tests, no netns lab; and nothing the image runs imports the lab.
"""

from __future__ import annotations

import ast
import fnmatch
import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from vnetd import __version__

ROOT = Path(__file__).parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
LOCK = ROOT / "requirements.lock"
PYTHON = {"python_version": "3.11", "python_full_version": "3.11.0", "sys_platform": "linux",
          "platform_system": "Linux", "os_name": "posix", "implementation_name": "cpython",
          "platform_python_implementation": "CPython", "platform_machine": "x86_64", "extra": ""}  # fmt: skip


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE)
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


def test_base_image_is_pinned_by_a_digest_the_build_is_given():
    steps = instructions()
    froms = [args for word, args in steps if word == "FROM"]
    assert froms == ["python:3.11-slim-bookworm@${BASE_DIGEST}"]
    assert steps[0] == ("ARG", "BASE_DIGEST"), "declared before FROM, without a default"
    assert "docker buildx imagetools inspect python:3.11-slim-bookworm" in DOCKERFILE


def test_oci_labels():
    labels = " ".join(args for word, args in instructions() if word == "LABEL")
    for key in ("title", "description", "version", "revision", "licenses", "base.name",
                "base.digest"):  # fmt: skip
        assert f"org.opencontainers.image.{key}=" in labels, key
    assert ("ARG", f"VERSION={__version__}") in instructions()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert f'licenses="{project["license"]}"' in labels


def test_locked_dependencies_are_installed_without_resolving():
    runs = [args for word, args in instructions() if word == "RUN"]
    assert "pip install --no-deps -r /src/requirements.lock" in runs
    assert any("pip install --no-deps /src" in r and "pip check" in r for r in runs)
    assert any("wireguard-go --version | grep -q 'v0\\.0\\.20220316'" in r for r in runs)


def lock_pins() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and re.fullmatch(r"[A-Za-z0-9.+!-]+", version), line
            pins[canonicalize_name(name)] = version
    return pins


def closure(requirements: list[str]) -> set[str]:
    """The names of ``requirements`` and of everything they need, from installed metadata."""
    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if (req.marker and not req.marker.evaluate(PYTHON)) or name in seen:
            continue
        seen.add(name)
        todo.extend(Requirement(r) for r in importlib.metadata.requires(req.name) or [])
    return seen


def test_lock_is_the_closure_of_the_dependencies_and_satisfies_them():
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = lock_pins()
    for requirement in map(Requirement, dependencies):
        version = pins.get(canonicalize_name(requirement.name))
        assert version is not None, f"{requirement.name} is not locked"
        assert requirement.specifier.contains(version, prereleases=True), (requirement, version)
    try:
        needed = closure(dependencies)
    except importlib.metadata.PackageNotFoundError as exc:
        pytest.skip(f"a dependency is not installed here ({exc}): the closure was not checked")
    assert set(pins) == needed, f"missing {needed - set(pins)}, extra {set(pins) - needed}"


def docker_context(root: Path) -> list[str]:
    """The files ``docker build`` sends: .dockerignore's patterns, the last match winning."""
    patterns = []
    for line in (root / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            patterns.append((line.startswith("!"), line.lstrip("!").rstrip("/")))
    sent = []
    for path in sorted(p for p in root.rglob("*") if p.is_file() and ".git" not in p.parts):
        rel = path.relative_to(root).as_posix()
        parents = [rel] + ["/".join(rel.split("/")[:i]) for i in range(1, rel.count("/") + 1)]
        included = True
        for negated, pattern in patterns:
            if any(fnmatch.fnmatchcase(p, pattern) for p in parents) or (
                pattern.startswith("**/") and fnmatch.fnmatchcase(rel, pattern[3:])
            ):
                included = negated
        if included:
            sent.append(rel)
    return sent


def test_build_context_is_the_package_without_lab_or_tests():
    sent = docker_context(ROOT)
    assert {"requirements.lock", "pyproject.toml", "README.md", "vnetd/cli.py"} <= set(sent)
    assert not [p for p in sent if p.startswith(("tests/", "vnetd/lab/", "bench/", "manifests/"))]
    assert not [p for p in sent if "__pycache__" in p or p.endswith(".pyc")]
    assert {p.split("/")[0] for p in sent} == {"requirements.lock", "pyproject.toml", "README.md",
                                              "vnetd"}  # fmt: skip


def test_nothing_the_image_runs_imports_the_lab():
    """Only ``vnetd demo`` (a development command) needs the lab the image leaves out."""
    importers = []
    for path in sorted((ROOT / "vnetd").rglob("*.py")):
        if "lab" in path.relative_to(ROOT / "vnetd").parts or path.name == "demo.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n == "vnetd.lab" or n.startswith("vnetd.lab.") for n in names):
                importers.append(path.relative_to(ROOT).as_posix())
    assert importers == []
