"""Validate custom resources offline: against the CRDs in ``crds/`` (copied from the
project that defines them) or the schemas in ``schemas/``.

Each schema there is written in this repository from the field names and
types of the custom resource's published API (its header says which); the
Kubernetes types they embed (``SecurityContext``, ``ObjectMeta``, ...)
refer to the strict Kubernetes schemas kubernetes-validate ships, resolved
for the Kubernetes version asked for. Unknown fields are errors.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from kubernetes_validate.utils import all_versions, major_minor, schema_contents
from referencing import Registry, Resource

SCHEMAS = Path(__file__).parent / "schemas"


def kubernetes_definitions(version: str) -> dict[str, Any]:
    """The strict ``_definitions.json`` of the newest shipped release of ``version`` (x.y)."""
    release = [v for v in all_versions() if major_minor(v) == version][-1]
    path = f"kubernetes-json-schema/v{release}-local-strict/_definitions.json"
    definitions: dict[str, Any] = schema_contents(path, release)
    return definitions


def validate_custom(doc: dict[str, Any], schema_name: str, version: str) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``doc`` fits ``schemas/<schema_name>.json``."""
    schema = json.loads((SCHEMAS / f"{schema_name}.json").read_text())
    registry: Registry = Resource.from_contents(kubernetes_definitions(version)) @ Registry()
    jsonschema.Draft202012Validator(schema, registry=registry).validate(doc)


CRDS = Path(__file__).parent / "crds"


def crd_schema(name: str) -> dict[str, Any]:
    """The JSON schema of ``crds/<name>.yaml`` (a CustomResourceDefinition copied from its
    project) with unknown fields as errors, as ``kubectl apply --validate=strict`` and the
    API server's field validation treat them (structural schemas prune nothing here)."""
    crd = yaml.safe_load((CRDS / f"{name}.yaml").read_text())
    (version,) = crd["spec"]["versions"]
    return _strict(version["schema"]["openAPIV3Schema"])


def validate_crd(doc: dict[str, Any], name: str) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``doc`` fits the CRD ``crds/<name>.yaml``."""
    jsonschema.Draft202012Validator(crd_schema(name)).validate(doc)


def _strict(node: Any) -> Any:  # noqa: ANN401 - a schema node of any JSON type
    """An OpenAPI v3 structural schema node as JSON Schema: Kubernetes' extensions mapped,
    objects with ``properties`` closed (``metadata`` has none: the API server checks it)."""
    if isinstance(node, list):
        return [_strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: _strict(value) for key, value in node.items()}
    if node.pop("x-kubernetes-int-or-string", False):
        node.pop("type", None)
        node["type"] = ["integer", "string"]
    if node.pop("nullable", False) and "type" in node:
        node["type"] = [node["type"], "null"]
    preserve = node.pop("x-kubernetes-preserve-unknown-fields", False)
    if "properties" in node and "additionalProperties" not in node and not preserve:
        node["additionalProperties"] = False
    return node
