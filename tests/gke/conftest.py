"""Fixtures for the GKE backend tests: the JobSet CRD schema (made strict) and the recorded
JobSet status objects in ``fixtures/`` (written by hand from the JobSet v1alpha2 API's status
shape: conditions, terminalState, replicatedJobsStatus, restarts).

The CRD schema is read from $RCPFLOW_JOBSET_CRD or
``<repo>/../shared/k8s/jobset.x-k8s.io_jobsets.yaml``.
Kubernetes *prunes* unknown fields of a custom resource instead of rejecting them, and the
schema says nothing about object names or labels, so `strict_jobset_schema` adds
``additionalProperties: false`` to every object that lists its properties (what
``kubectl --validate=strict`` / fieldValidation=Strict does) and the apiserver's name and label
rules; a misspelt field then fails validation here instead of vanishing on the cluster.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
CRD_ENV = "RCPFLOW_JOBSET_CRD"
DEFAULT_CRD = REPO.parent / "shared" / "k8s" / "jobset.x-k8s.io_jobsets.yaml"

# apimachinery validation: DNS-1123 subdomain names, qualified label keys, label values.
_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_LABEL_KEY = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
_LABELS = {
    "type": "object",
    "propertyNames": {"pattern": _LABEL_KEY, "maxLength": 316},
    "additionalProperties": {"type": "string", "maxLength": 63, "pattern": _LABEL_VALUE},
}
_OBJECT_META = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "maxLength": 253, "pattern": _NAME},
        "namespace": {"type": "string", "maxLength": 63, "pattern": _DNS_LABEL},
        "labels": _LABELS,
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}


def crd_path() -> Path | None:
    """Where the JobSet CRD is, or None when neither place has it."""
    from_env = os.environ.get(CRD_ENV)
    for candidate in ([Path(from_env)] if from_env else []) + [DEFAULT_CRD]:
        if candidate.is_file():
            return candidate
    return None


def _strict(node: Any) -> Any:
    if isinstance(node, dict):
        node = {k: _strict(v) for k, v in node.items()}
        if (
            "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
        if "labels" in node.get("properties", {}):
            node["properties"]["labels"] = _LABELS
        return node
    if isinstance(node, list):
        return [_strict(v) for v in node]
    return node


@pytest.fixture(scope="session")
def crd_schema() -> dict[str, Any]:
    """The CRD's openAPIV3Schema as shipped (Kubernetes' own, lenient view)."""
    path = crd_path()
    if path is None:
        where = os.environ.get(CRD_ENV) or "(unset)"
        pytest.skip(
            f"JobSet CRD schema not found: set ${CRD_ENV} (now {where}) or put the CRD at "
            f"{DEFAULT_CRD} (kubernetes-sigs/jobset config/components/crd/bases/"
            "jobset.x-k8s.io_jobsets.yaml)"
        )
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crd = yaml.load(path.read_text(), Loader=loader)  # noqa: S506 - a safe loader
    version = crd["spec"]["versions"][0]
    assert version["name"] == "v1alpha2", f"{path}: first version is {version['name']}"
    return version["schema"]["openAPIV3Schema"]


@pytest.fixture(scope="session")
def strict_jobset_schema(crd_schema: dict[str, Any]) -> dict[str, Any]:
    schema = _strict(copy.deepcopy(crd_schema))
    schema["properties"]["metadata"] = _OBJECT_META
    return schema


class SchemaCheck:
    """A jsonschema validator for one schema; `errors` lists every problem as ``path: message``
    (empty list: valid)."""

    def __init__(self, schema: dict[str, Any]) -> None:
        import jsonschema

        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
        cls.check_schema(schema)
        self._validator = cls(schema)

    def errors(self, obj: Any) -> list[str]:
        found = sorted(self._validator.iter_errors(obj), key=lambda e: list(map(str, e.path)))
        return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in found]


@pytest.fixture(scope="session")
def strict_jobset(strict_jobset_schema: dict[str, Any]) -> SchemaCheck:
    """Validates a whole JobSet object strictly."""
    return SchemaCheck(strict_jobset_schema)


@pytest.fixture(scope="session")
def lenient_jobset(crd_schema: dict[str, Any]) -> SchemaCheck:
    """Validates against the CRD schema exactly as shipped."""
    return SchemaCheck(crd_schema)


@pytest.fixture(scope="session")
def recorded_status():  # noqa: ANN201 - a loader function
    """Load a recorded JobSet object from fixtures/ by file name."""

    def load(name: str) -> dict[str, Any]:
        return json.loads((FIXTURES / name).read_text())

    return load
