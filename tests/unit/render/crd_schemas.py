"""Validate custom resources offline against the schemas in ``schemas/``.

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
