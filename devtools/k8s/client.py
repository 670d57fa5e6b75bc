"""A small REST client of the API server (standard library only): JSON in and out, server-side
apply, the kinds the harness itself applies."""

from __future__ import annotations

import contextlib
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from devtools.k8s.errors import ControlPlaneError
from devtools.k8s.pki import Pki


class ApiError(ControlPlaneError):
    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:2000]}")
        self.status = status
        self.body = body


@dataclass(frozen=True)
class Kind:
    group_version: str
    plural: str
    namespaced: bool


# What the harness itself applies (manifests of the controllers, nodes, its own objects).
KINDS: dict[str, Kind] = {
    "Namespace": Kind("v1", "namespaces", False),
    "ServiceAccount": Kind("v1", "serviceaccounts", True),
    "Secret": Kind("v1", "secrets", True),
    "ConfigMap": Kind("v1", "configmaps", True),
    "Service": Kind("v1", "services", True),
    "Node": Kind("v1", "nodes", False),
    "Pod": Kind("v1", "pods", True),
    "CustomResourceDefinition": Kind("apiextensions.k8s.io/v1", "customresourcedefinitions", False),
    "ClusterRole": Kind("rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": Kind("rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": Kind("rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": Kind("rbac.authorization.k8s.io/v1", "rolebindings", True),
    "MutatingWebhookConfiguration": Kind(
        "admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations", False
    ),
    "ValidatingWebhookConfiguration": Kind(
        "admissionregistration.k8s.io/v1", "validatingwebhookconfigurations", False
    ),
    "APIService": Kind("apiregistration.k8s.io/v1", "apiservices", False),
    "PriorityClass": Kind("scheduling.k8s.io/v1", "priorityclasses", False),
    "JobSet": Kind("jobset.x-k8s.io/v1alpha2", "jobsets", True),
    "ResourceFlavor": Kind("kueue.x-k8s.io/v1beta2", "resourceflavors", False),
    "ClusterQueue": Kind("kueue.x-k8s.io/v1beta2", "clusterqueues", False),
    "LocalQueue": Kind("kueue.x-k8s.io/v1beta2", "localqueues", True),
}


class Api:
    """A small client of the API server (stdlib only): JSON in and out, the admin certificate."""

    def __init__(self, url: str, pki: Pki, token: str | None = None) -> None:
        self.url = url
        self.context = ssl.create_default_context(cafile=str(pki.ca_crt))
        self.token = token
        if token is None:
            self.context.load_cert_chain(str(pki.admin_crt), str(pki.admin_key))

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        timeout_s: float = 30.0,
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        if self.token is not None:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=timeout_s, context=self.context) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise ApiError(exc.code, method, path, exc.read().decode(errors="replace")) from exc
        text = raw.decode()
        if not text:
            return None
        try:
            return json.loads(text)
        except ValueError:
            return text

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    @staticmethod
    def path_of(obj: Mapping[str, Any], *, with_name: bool = True) -> str:
        kind = KINDS.get(str(obj.get("kind")))
        if kind is None:
            raise ControlPlaneError(f"the harness does not know the kind {obj.get('kind')!r}")
        metadata = obj.get("metadata") or {}
        base = "/api/v1" if kind.group_version == "v1" else f"/apis/{kind.group_version}"
        if kind.namespaced:
            base += f"/namespaces/{metadata.get('namespace') or 'default'}"
        base += f"/{kind.plural}"
        return f"{base}/{metadata['name']}" if with_name else base

    def apply(self, obj: Mapping[str, Any], manager: str = "rcpflow-harness") -> Any:
        """Server-side apply of `obj` (created or updated)."""
        query = urllib.parse.urlencode({"fieldManager": manager, "force": "true"})
        return self.request(
            "PATCH",
            f"{self.path_of(obj)}?{query}",
            obj,
            content_type="application/apply-patch+yaml",
        )

    def delete(self, obj: Mapping[str, Any]) -> None:
        with contextlib.suppress(ApiError):
            self.request("DELETE", self.path_of(obj))
