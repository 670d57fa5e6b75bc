"""The JobSet version gate: a rendered JobSet is created only on a cluster whose JobSet CRD has
every field it uses. An older controller's CRD would *prune* an unknown field (the failure
policy's message patterns are JobSet v0.10's: without them the disruption rule matches every
exit, and a job with bad arguments restarts forever), so the operators read the CRD first and
refuse, naming what is missing, the release that added it and the release needed; the create
itself is strict (``fieldValidation=Strict``) as a second net. Pure standard library.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from tasks.backends.gke.render import JOBSET_GROUP, JOBSET_PLURAL, JOBSET_VERSION

CRD_NAME = f"{JOBSET_PLURAL}.{JOBSET_GROUP}"
# What rcpflow's JobSets rely on and the JobSet release that brought it. The CRD holds no
# controller version, so fields stand for releases: v0.10's message patterns are rendered into
# every JobSet, and a v0.10 controller also sets the jobset.sigs.k8s.io/jobset-uid pod label
# (v0.9) that the evaluation attempt ids read.
FIELD_RELEASES: dict[str, str] = {
    "spec.failurePolicy.rules[].onJobFailureMessagePatterns": "v0.10",
    "spec.coordinator": "v0.6",
}
MINIMUM_JOBSET = "v0.10"
VERSION_LABEL = "app.kubernetes.io/version"


class JobSetVersionError(RuntimeError):
    """The cluster's JobSet API lacks what the rendered JobSet uses."""


def unknown_fields(obj: Any, schema: Mapping[str, Any], path: str = "") -> list[str]:
    """The fields of `obj` that `schema` (an OpenAPI v3 schema of a structural CRD) does not
    have, as dotted paths (``spec.a.b[0].c``): what the apiserver would prune, or refuse under
    fieldValidation=Strict. Objects without listed properties (``metadata``, preserved unknown
    fields, maps) accept any key."""
    found: list[str] = []
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return found
    if isinstance(obj, Mapping):
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, value in obj.items():
            where = f"{path}.{key}" if path else str(key)
            if isinstance(properties, Mapping) and key in properties:
                found += unknown_fields(value, properties[key], where)
            elif isinstance(extra, Mapping):
                found += unknown_fields(value, extra, where)
            elif isinstance(properties, Mapping):
                found.append(where)
    elif isinstance(obj, list) and isinstance(schema.get("items"), Mapping):
        for i, item in enumerate(obj):
            found += unknown_fields(item, schema["items"], f"{path}[{i}]")
    return found


def served_schema(crd: Mapping[str, Any]) -> Mapping[str, Any]:
    """The openAPIV3Schema of the CRD's served JOBSET_VERSION; JobSetVersionError without."""
    versions = crd.get("spec", {}).get("versions", [])
    for version in versions:
        if version.get("name") == JOBSET_VERSION and version.get("served"):
            schema = version.get("schema", {}).get("openAPIV3Schema")
            if isinstance(schema, Mapping):
                return schema
    served = [v.get("name") for v in versions if v.get("served")]
    raise JobSetVersionError(
        f"the cluster's {CRD_NAME} CRD does not serve {JOBSET_VERSION} with a schema (it serves "
        f"{', '.join(map(str, served)) or 'nothing'}); install JobSet {MINIMUM_JOBSET} or newer"
    )


def check_crd(crd: Mapping[str, Any], jobset: Mapping[str, Any]) -> None:
    """Refuse `jobset` (JobSetVersionError) when the cluster's CRD `crd` lacks a field of it."""
    schema = served_schema(crd)
    missing = unknown_fields(jobset, schema)
    if not missing:
        return
    releases = {r for r in map(_release, missing) if r is not None}
    needed = max(releases | {MINIMUM_JOBSET}, key=_release_key)
    labels = crd.get("metadata", {}).get("labels") or {}
    found = (
        f"JobSet {labels[VERSION_LABEL]}"
        if VERSION_LABEL in labels
        else "a JobSet release without a version label"
    )
    older = [f"{p} (JobSet {_release(p)})" if _release(p) else p for p in missing]
    raise JobSetVersionError(
        f"the cluster's {CRD_NAME} CRD ({found}, {JOBSET_VERSION}) lacks {', '.join(older)}: "
        f"it is older than JobSet {needed}, which this JobSet needs; the apiserver would drop "
        f"the field and change the failure policy. Install JobSet {needed} or newer"
    )


def _release(path: str) -> str | None:
    return FIELD_RELEASES.get(re.sub(r"\[\d+\]", "[]", path))


def _release_key(release: str) -> tuple[int, ...]:
    return tuple(int(p) for p in release.lstrip("v").split("."))
