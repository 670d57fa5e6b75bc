"""A kubebuilder-laid-out controller's manifests (``config/components``: CRDs, RBAC, webhooks),
read with their kustomize patches applied, and its webhooks pointed at 127.0.0.1."""

from __future__ import annotations

import base64
import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from devtools.k8s.errors import ControlPlaneError


def _load_yaml_documents(path: Path) -> list[dict[str, Any]]:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return [d for d in yaml.load_all(path.read_text(), Loader=loader) if isinstance(d, dict)]


def _json_patch(doc: Any, ops: Sequence[Mapping[str, Any]]) -> Any:
    """RFC 6902 add / replace / remove (what the controllers' kustomize patches use)."""
    doc = copy.deepcopy(doc)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in str(op["path"]).split("/")[1:]]
        parent = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        last = parts[-1]
        action = op["op"]
        if isinstance(parent, list):
            index = len(parent) if last == "-" else int(last)
            if action == "add":
                parent.insert(index, copy.deepcopy(op["value"]))
            elif action == "replace":
                parent[index] = copy.deepcopy(op["value"])
            elif action == "remove":
                del parent[index]
            else:
                raise ControlPlaneError(f"unsupported JSON patch op {action!r}")
        elif action in ("add", "replace"):
            parent[last] = copy.deepcopy(op["value"])
        elif action == "remove":
            del parent[last]
        else:
            raise ControlPlaneError(f"unsupported JSON patch op {action!r}")
    return doc


def controller_manifests(config_dir: Path, prefix: str) -> dict[str, Any]:
    """The CRDs, the manager ClusterRole's rules and the webhook configurations of a
    kubebuilder-laid-out controller's ``config/components`` (JobSet, Kueue), with the
    kustomize patches of the webhooks applied and names given `prefix` as its kustomization
    does."""
    if not config_dir.is_dir():
        raise ControlPlaneError(f"{config_dir} is missing (build.sh copies it beside the binary)")
    crds = []
    for path in sorted((config_dir / "crd" / "bases").glob("*.yaml")):
        crds += [
            d for d in _load_yaml_documents(path) if d.get("kind") == "CustomResourceDefinition"
        ]
    rules: list[Any] = []
    role = config_dir / "rbac" / "role.yaml"
    for doc in _load_yaml_documents(role):
        if doc.get("kind") == "ClusterRole":
            rules += doc.get("rules") or []
    # Roles in the controller's own namespace (Kueue's secrets, leader election), as the RBAC
    # kustomization lists them.
    namespaced_rules: list[Any] = []
    rbac = _load_yaml_documents(config_dir / "rbac" / "kustomization.yaml")
    for resource in (rbac[0].get("resources") or []) if rbac else []:
        path = config_dir / "rbac" / str(resource)
        if path.is_file():
            for doc in _load_yaml_documents(path):
                if doc.get("kind") == "Role":
                    namespaced_rules += doc.get("rules") or []
    webhooks: list[dict[str, Any]] = []
    manifests = config_dir / "webhook" / "manifests.yaml"
    if manifests.is_file():
        docs = _load_yaml_documents(manifests)
        kustomization = _load_yaml_documents(config_dir / "webhook" / "kustomization.yaml")
        for entry in (kustomization[0].get("patches") or []) if kustomization else []:
            target = entry.get("target") or {}
            patch_path = config_dir / "webhook" / str(entry.get("path"))
            if not patch_path.is_file():
                continue
            import yaml

            ops = yaml.safe_load(patch_path.read_text())
            if not isinstance(ops, list):
                continue  # a strategic-merge patch: not needed here
            docs = [
                _json_patch(d, ops)
                if d.get("kind") == target.get("kind")
                and d["metadata"]["name"] == target.get("name")
                else d
                for d in docs
            ]
        for doc in docs:
            doc = copy.deepcopy(doc)
            doc["metadata"]["name"] = prefix + doc["metadata"]["name"]
            webhooks.append(doc)
    return {
        "crds": crds,
        "rules": rules,
        "namespaced_rules": namespaced_rules,
        "webhooks": webhooks,
    }


def local_webhooks(
    webhook_configs: Sequence[Mapping[str, Any]], port: int, ca_pem: bytes
) -> list[dict[str, Any]]:
    """The webhook configurations with every service reference replaced by the controller's
    address on 127.0.0.1 and our CA."""
    out: list[dict[str, Any]] = []
    ca = base64.b64encode(ca_pem).decode()
    for original in webhook_configs:
        config = copy.deepcopy(dict(original))
        for hook in config.get("webhooks") or []:
            service = hook["clientConfig"].get("service") or {}
            path = service.get("path", "/")
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca}
            hook.setdefault("timeoutSeconds", 10)
        out.append(config)
    return out
