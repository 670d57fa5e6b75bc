"""JobSet hooks: every call the GKE backend makes to a cluster's API goes through these.

`JobSetHook` (sync, for operators) is the cncf-kubernetes provider's `KubernetesHook` with the
Google provider's GKE credentials (`GKEKubernetesHook`); `for_cluster` finds the cluster's
endpoint and CA with the provider's `GKEHook` (`cluster_endpoint`), on every call: nothing
keeps an endpoint that may have moved. `AsyncJobSetHook` (for triggers) is the same on
`AsyncKubernetesHook` (`GKEKubernetesAsyncHook`). Both speak JobSets and their pods only: read
the JobSet CRD, create (strict field validation), read, delete, list pods; a JobSet that does
not exist is `JobSetGone`.

Responses are read raw (``_preload_content=False``): the clients log a decoded body at DEBUG,
and a JobSet's body carries env values.

Importing this module costs seconds (the providers and kubernetes clients): operators and
triggers import it in the method that needs it, never at DAG-parse time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from typing import Any

from airflow.providers.google.cloud.hooks.kubernetes_engine import (
    GKEHook,
    GKEKubernetesAsyncHook,
    GKEKubernetesHook,
)
from airflow.providers.google.cloud.operators.kubernetes_engine import GKEClusterAuthDetails
from kubernetes.client import ApiextensionsV1Api
from kubernetes.client.exceptions import ApiException
from kubernetes_asyncio.client import CoreV1Api, CustomObjectsApi
from kubernetes_asyncio.client.exceptions import ApiException as AsyncApiException

from tasks.backends.gke.crd import CRD_NAME
from tasks.backends.gke.render import (
    JOBSET_GROUP,
    JOBSET_NAME_LABEL,
    JOBSET_PLURAL,
    JOBSET_VERSION,
    jobset_ref,
)
from tasks.backends.gke.settings import GkeCluster
from tasks.backends.gke.status import JobSetGone


@contextlib.contextmanager
def _gone_on_404(namespace: str, name: str) -> Iterator[None]:
    """An API answer 404 (either client's) as JobSetGone."""
    try:
        yield
    except (ApiException, AsyncApiException) as exc:
        if exc.status == 404:
            raise JobSetGone(f"JobSet {namespace}/{name} not found") from exc
        raise


def cluster_endpoint(cluster: GkeCluster) -> tuple[str, str]:
    """The URL and CA certificate of `cluster`'s API, looked up as the provider's GKE
    operators do (`GKEClusterAuthDetails`: the GKE API through the Google connection)."""
    url, ca_cert = GKEClusterAuthDetails(
        cluster_name=cluster.cluster_name,
        project_id=cluster.project_id,  # type: ignore[arg-type]  # None: the connection's
        use_internal_ip=cluster.use_internal_ip,
        use_dns_endpoint=cluster.use_dns_endpoint,
        cluster_hook=GKEHook(
            gcp_conn_id=cluster.gcp_conn_id,
            location=cluster.location,
            impersonation_chain=list(cluster.impersonation_chain) or None,
        ),
    ).fetch_cluster_info()
    return url, ca_cert


def _hook_args(cluster: GkeCluster, url: str, ca_cert: str) -> dict[str, Any]:
    """What either hook is built with for `cluster` at the endpoint `url` with CA `ca_cert`."""
    return {
        "cluster_url": url,
        "ssl_ca_cert": ca_cert,
        "use_dns_endpoint": cluster.use_dns_endpoint,
        "gcp_conn_id": cluster.gcp_conn_id,
        "impersonation_chain": list(cluster.impersonation_chain) or None,
    }


# The JobSet resource, as every custom-object call of either client names it.
_JOBSET_RESOURCE: dict[str, Any] = {
    "group": JOBSET_GROUP,
    "version": JOBSET_VERSION,
    "plural": JOBSET_PLURAL,
}


def _raise_for_status(response: Any) -> None:
    """kubernetes_asyncio raises for an error status only when it decodes the body itself:
    the same ApiException for a raw response."""
    if not 200 <= response.status <= 299:
        raise AsyncApiException(status=response.status, reason=response.reason)


class JobSetHook(GKEKubernetesHook):
    """JobSets on one GKE cluster, synchronously (operators)."""

    @classmethod
    def for_cluster(cls, cluster: GkeCluster) -> JobSetHook:
        """The hook for `cluster`, its endpoint and CA looked up now (`cluster_endpoint`)."""
        url, ca_cert = cluster_endpoint(cluster)
        return cls(**_hook_args(cluster, url, ca_cert))

    def get_jobset_crd(self) -> dict[str, Any]:
        """The cluster's JobSet CustomResourceDefinition (apiextensions.k8s.io/v1) as a dict;
        ApiException 404 when JobSet is not installed."""
        response: Any = ApiextensionsV1Api(self.api_client).read_custom_resource_definition(
            CRD_NAME, _preload_content=False
        )
        crd: dict[str, Any] = json.loads(response.data)
        return crd

    def create_jobset(self, body: dict[str, Any]) -> bool:
        """Create the JobSet `body` with strict field validation (a field the cluster's CRD
        does not know is an error, never silently dropped); False when one of that name exists
        already (409). Sent once: a retried create cannot tell its own earlier success from a
        foreign one, so the caller reads the JobSet back (`get_jobset`) whatever this
        returned. Nothing of the body is logged (it carries env values)."""
        ref = jobset_ref(body)
        try:
            self.custom_object_client.create_namespaced_custom_object(
                **_JOBSET_RESOURCE,
                body=body,
                namespace=ref["namespace"],
                field_validation="Strict",
                _preload_content=False,
            )
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    def get_jobset(self, namespace: str, name: str) -> dict[str, Any]:
        """The JobSet object; JobSetGone when it does not exist."""
        with _gone_on_404(namespace, name):
            response: Any = self.custom_object_client.get_namespaced_custom_object(
                **_JOBSET_RESOURCE,
                name=name,
                namespace=namespace,
                _preload_content=False,
            )
        found: dict[str, Any] = json.loads(response.data)
        return found

    def delete_jobset(self, namespace: str, name: str) -> bool:
        """Delete the JobSet (and so its pods); False when it did not exist."""
        try:
            with _gone_on_404(namespace, name):
                self.custom_object_client.delete_namespaced_custom_object(
                    **_JOBSET_RESOURCE,
                    name=name,
                    namespace=namespace,
                    _preload_content=False,
                )
        except JobSetGone:
            return False
        return True


class AsyncJobSetHook(GKEKubernetesAsyncHook):
    """JobSets on one GKE cluster, from the triggerer's event loop."""

    @classmethod
    async def for_cluster(cls, cluster: GkeCluster) -> AsyncJobSetHook:
        """The hook for `cluster`, its endpoint and CA looked up now (`cluster_endpoint`, in a
        thread: the provider's lookup is synchronous)."""
        url, ca_cert = await asyncio.to_thread(cluster_endpoint, cluster)
        return cls(**_hook_args(cluster, url, ca_cert))

    async def get_jobset(self, namespace: str, name: str) -> dict[str, Any]:
        """The JobSet object; JobSetGone when it does not exist."""
        async with self.get_conn() as api_client:
            with _gone_on_404(namespace, name):
                response: Any = await CustomObjectsApi(api_client).get_namespaced_custom_object(
                    **_JOBSET_RESOURCE,
                    namespace=namespace,
                    name=name,
                    _preload_content=False,
                )
                _raise_for_status(response)
                found: dict[str, Any] = await response.json()
        return found

    async def delete_jobset(self, namespace: str, name: str) -> bool:
        """Delete the JobSet (and so its pods); False when it did not exist."""
        try:
            async with self.get_conn() as api_client:
                with _gone_on_404(namespace, name):
                    response: Any = await CustomObjectsApi(
                        api_client
                    ).delete_namespaced_custom_object(
                        **_JOBSET_RESOURCE,
                        namespace=namespace,
                        name=name,
                        _preload_content=False,
                    )
                    response.release()
                    _raise_for_status(response)
        except JobSetGone:
            return False
        return True

    async def list_jobset_pods(self, namespace: str, name: str) -> dict[str, Any]:
        """The JobSet's pods, a core/v1 PodList as a dict: the raw JSON, because the client's
        models refuse a pod missing a field they require, and only the status is read."""
        async with self.get_conn() as api_client:
            response: Any = await CoreV1Api(api_client).list_namespaced_pod(
                namespace=namespace,
                label_selector=f"{JOBSET_NAME_LABEL}={name}",
                _preload_content=False,  # the HTTP response, not models
            )
            _raise_for_status(response)
            return dict(await response.json())
