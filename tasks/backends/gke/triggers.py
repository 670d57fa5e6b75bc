"""`JobSetTrigger`: follow a JobSet on the triggerer until it is terminal.

It polls through the Google provider's `GKEKubernetesAsyncHook`; the provider and kubernetes
modules are imported only in `read_jobset`, so importing this module stays cheap.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from functools import cached_property
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from tasks.backends.gke.render import JOBSET_GROUP, JOBSET_PLURAL, JOBSET_VERSION
from tasks.backends.gke.status import JobSetStatusError, interpret_status


class JobSetGone(RuntimeError):
    """The JobSet being watched does not exist (deleted while it ran)."""


class JobSetTrigger(BaseTrigger):
    """Poll a JobSet every `poll_interval_s` until it is terminal; one event:
    ``{"phase": "Succeeded"|"Failed"|"error", "name", "namespace", "reason", "message",
    "progress"}``. A JobSet that disappears is Failed (reason NotFound); `max_consecutive_errors`
    failed reads in a row give ``error``; a malformed status gives ``error`` at once."""

    def __init__(
        self,
        *,
        name: str,
        namespace: str,
        cluster_url: str,
        ssl_ca_cert: str,
        gcp_conn_id: str = "google_cloud_default",
        impersonation_chain: str | Sequence[str] | None = None,
        use_dns_endpoint: bool = False,
        poll_interval_s: float = 30.0,
        max_consecutive_errors: int = 5,
    ) -> None:
        super().__init__()
        self.name = name
        self.namespace = namespace
        self.cluster_url = cluster_url
        self.ssl_ca_cert = ssl_ca_cert
        self.gcp_conn_id = gcp_conn_id
        self.impersonation_chain = impersonation_chain
        self.use_dns_endpoint = use_dns_endpoint
        self.poll_interval_s = poll_interval_s
        self.max_consecutive_errors = max_consecutive_errors

    def serialize(self) -> tuple[str, dict[str, Any]]:
        # This module's path; plugins.jobset keeps the path of older releases importable.
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "name": self.name,
                "namespace": self.namespace,
                "cluster_url": self.cluster_url,
                "ssl_ca_cert": self.ssl_ca_cert,
                "gcp_conn_id": self.gcp_conn_id,
                "impersonation_chain": self.impersonation_chain,
                "use_dns_endpoint": self.use_dns_endpoint,
                "poll_interval_s": self.poll_interval_s,
                "max_consecutive_errors": self.max_consecutive_errors,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        where = f"JobSet {self.namespace}/{self.name}"
        errors = 0
        last_line = None
        while True:
            try:
                jobset = await self.read_jobset()
            except JobSetGone as exc:
                yield TriggerEvent(self._event("Failed", reason="NotFound", message=str(exc)))
                return
            except Exception as exc:
                errors += 1
                self.log.warning("%s: read %d failed: %r", where, errors, exc)
                if errors >= self.max_consecutive_errors:
                    message = f"{errors} reads in a row failed, last: {exc!r}"
                    yield TriggerEvent(self._event("error", message=message))
                    return
                await asyncio.sleep(self.poll_interval_s)
                continue
            errors = 0
            try:
                status = interpret_status(jobset)
            except JobSetStatusError as exc:
                yield TriggerEvent(self._event("error", message=f"unreadable status: {exc}"))
                return
            line = status.describe()
            if line != last_line:
                self.log.info("%s: %s", where, line)
                last_line = line
            if status.terminal:
                yield TriggerEvent(
                    self._event(
                        status.phase,
                        reason=status.reason,
                        message=status.message,
                        progress=status.progress,
                    )
                )
                return
            await asyncio.sleep(self.poll_interval_s)

    def _event(
        self, phase: str, *, reason: str = "", message: str = "", progress: str = ""
    ) -> dict[str, str]:
        return {
            "phase": phase,
            "name": self.name,
            "namespace": self.namespace,
            "reason": reason,
            "message": message,
            "progress": progress,
        }

    async def read_jobset(self) -> dict[str, Any]:
        """The JobSet object from the cluster; JobSetGone when it does not exist."""
        from kubernetes_asyncio.client import CustomObjectsApi
        from kubernetes_asyncio.client.exceptions import ApiException

        async with self._hook.get_conn() as api_client:
            try:
                return await CustomObjectsApi(api_client).get_namespaced_custom_object(
                    group=JOBSET_GROUP,
                    version=JOBSET_VERSION,
                    namespace=self.namespace,
                    plural=JOBSET_PLURAL,
                    name=self.name,
                )
            except ApiException as exc:
                if exc.status == 404:
                    raise JobSetGone(f"JobSet {self.namespace}/{self.name} not found") from exc
                raise

    @cached_property
    def _hook(self) -> Any:
        from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEKubernetesAsyncHook

        return GKEKubernetesAsyncHook(
            cluster_url=self.cluster_url,
            ssl_ca_cert=self.ssl_ca_cert,
            gcp_conn_id=self.gcp_conn_id,
            impersonation_chain=self.impersonation_chain,
            use_dns_endpoint=self.use_dns_endpoint,
        )
