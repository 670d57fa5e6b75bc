"""JobSet hooks: every call the GKE backend makes to a cluster's API goes through these.

`JobSetHook` (sync, for operators) and `AsyncJobSetHook` (for triggers) speak JobSets and their
pods only: read the JobSet CRD, create (strict field validation), read, delete, list pods; a
JobSet that does not exist is `JobSetGone`. `for_cluster` picks how the cluster is reached:
- a GKE cluster (the default): the cncf-kubernetes provider's hooks with the Google provider's
  GKE credentials (`GKEKubernetesHook`, `GKEKubernetesAsyncHook`); the cluster's endpoint and
  CA are looked up with the provider's `GKEHook` (`cluster_endpoint`) on every call: nothing
  keeps an endpoint that may have moved;
- `kubernetes_conn_id` set: the cncf-kubernetes provider's own hooks on that Kubernetes
  connection (a kubeconfig, or in-cluster), with no GKE lookup.

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
from typing import TYPE_CHECKING, Any

from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook, KubernetesHook
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


class _OtherObject(RuntimeError):
    """A delete's UID precondition failed: the name holds another object now."""


@contextlib.contextmanager
def _other_on_409(uid: str | None) -> Iterator[None]:
    """A delete with a UID precondition answered 409 (the apiserver's "Precondition failed:
    UID in precondition ...", either client's) as _OtherObject."""
    try:
        yield
    except (ApiException, AsyncApiException) as exc:
        if uid is not None and exc.status == 409:
            raise _OtherObject(f"not the object of uid {uid}") from exc
        raise


def _delete_options(uid: str | None) -> dict[str, Any]:
    """A delete call's DeleteOptions body: the UID precondition when `uid` is given."""
    if uid is None:
        return {}
    return {"body": {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}}


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


class JobSetHook:
    """JobSets on one cluster, synchronously (operators): the calls, on whichever provider
    hook `for_cluster` picks (`GkeJobSetHook`, `KubeconfigJobSetHook`)."""

    if TYPE_CHECKING:  # the provider hook's clients, which each subclass inherits
        api_client: Any
        custom_object_client: Any

    @staticmethod
    def for_cluster(cluster: GkeCluster) -> JobSetHook:
        """The hook for `cluster`: on its Kubernetes connection when it names one, else GKE's,
        its endpoint and CA looked up now (`cluster_endpoint`)."""
        if cluster.kubernetes_conn_id is not None:
            return KubeconfigJobSetHook(conn_id=cluster.kubernetes_conn_id)
        url, ca_cert = cluster_endpoint(cluster)
        return GkeJobSetHook(**_hook_args(cluster, url, ca_cert))

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

    def delete_jobset(self, namespace: str, name: str, uid: str | None = None) -> bool:
        """Delete the JobSet (and so its pods); False when it did not exist. With `uid`, only
        the object of that UID (the API's precondition: one created again under the name is
        another object): False, nothing deleted, when the name holds another."""
        try:
            with _gone_on_404(namespace, name), _other_on_409(uid):
                self.custom_object_client.delete_namespaced_custom_object(
                    **_JOBSET_RESOURCE,
                    name=name,
                    namespace=namespace,
                    **_delete_options(uid),
                    _preload_content=False,
                )
        except (JobSetGone, _OtherObject):
            return False
        return True


class GkeJobSetHook(JobSetHook, GKEKubernetesHook):
    """JobSets on a GKE cluster, with the Google connection's credentials."""


class KubeconfigJobSetHook(JobSetHook, KubernetesHook):
    """JobSets on the cluster of a cncf-kubernetes connection (a kubeconfig, or in-cluster)."""


class AsyncJobSetHook:
    """JobSets on one cluster, from the triggerer's event loop: the calls, on whichever
    provider hook `for_cluster` picks (`AsyncGkeJobSetHook`, `AsyncKubeconfigJobSetHook`)."""

    if TYPE_CHECKING:  # the provider hook's connection, which each subclass inherits
        get_conn: Any

    @staticmethod
    async def for_cluster(cluster: GkeCluster) -> AsyncJobSetHook:
        """The hook for `cluster`: on its Kubernetes connection when it names one, else GKE's,
        its endpoint and CA looked up now (`cluster_endpoint`, in a thread: the provider's
        lookup is synchronous)."""
        if cluster.kubernetes_conn_id is not None:
            return AsyncKubeconfigJobSetHook(conn_id=cluster.kubernetes_conn_id)
        url, ca_cert = await asyncio.to_thread(cluster_endpoint, cluster)
        return AsyncGkeJobSetHook(**_hook_args(cluster, url, ca_cert))

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

    async def delete_jobset(self, namespace: str, name: str, uid: str | None = None) -> bool:
        """Delete the JobSet (and so its pods); False when it did not exist, or (with `uid`)
        when the name holds another object than that UID's (`JobSetHook.delete_jobset`)."""
        try:
            async with self.get_conn() as api_client:
                with _gone_on_404(namespace, name), _other_on_409(uid):
                    response: Any = await CustomObjectsApi(
                        api_client
                    ).delete_namespaced_custom_object(
                        **_JOBSET_RESOURCE,
                        namespace=namespace,
                        name=name,
                        **_delete_options(uid),
                        _preload_content=False,
                    )
                    response.release()
                    _raise_for_status(response)
        except (JobSetGone, _OtherObject):
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


class AsyncGkeJobSetHook(AsyncJobSetHook, GKEKubernetesAsyncHook):
    """JobSets on a GKE cluster, with the Google connection's credentials, asynchronously."""


class AsyncKubeconfigJobSetHook(AsyncJobSetHook, AsyncKubernetesHook):
    """JobSets on the cluster of a cncf-kubernetes connection, asynchronously."""
