"""The RBAC objects the harness makes: a ClusterRole bound to a subject, and a controller's
namespace, service account and roles (what its manifests list, nothing more)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from devtools.k8s.client import Api


def grant(api: Api, role: str, rules: Sequence[Any], subject: Mapping[str, str]) -> None:
    """A ClusterRole `role` of `rules`, bound to `subject` (a ServiceAccount, a User)."""
    api.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": role},
            "rules": list(rules),
        }
    )
    api.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": role},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role,
            },
            "subjects": [dict(subject)],
        }
    )


def service_account(
    api: Api,
    namespace: str,
    account: str,
    role: str,
    rules: Sequence[Any],
    namespaced_rules: Sequence[Any] = (),
) -> None:
    """`namespace`, the service account `account` in it, the ClusterRole `role` of `rules`
    bound to it and, when `namespaced_rules`, a Role of them in `namespace` bound to it too."""
    api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    api.apply(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": account, "namespace": namespace},
        }
    )
    subject = {"kind": "ServiceAccount", "name": account, "namespace": namespace}
    grant(api, role, rules, subject)
    if namespaced_rules:
        api.apply(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": role, "namespace": namespace},
                "rules": list(namespaced_rules),
            }
        )
        api.apply(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": role, "namespace": namespace},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
                "subjects": [subject],
            }
        )
