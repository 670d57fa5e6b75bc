"""Fixtures for the GKE backend tests: the JobSet CRD schema (made strict) and the recorded
JobSet status objects in ``fixtures/`` (written by hand from the JobSet v1alpha2 API's status
shape: conditions, terminalState, replicatedJobsStatus, restarts).

The CRD schema is read from $RCPFLOW_JOBSET_CRD or
``<repo>/../shared/k8s/jobset.x-k8s.io_jobsets.yaml``; without it the schema tests are skipped
with that reason (``-ra`` lists it in the summary), and fail when ``CI`` is set.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import google.auth.credentials
import pytest
from env_helpers import set_env
from repo_paths import REPO

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
def crd_document() -> dict[str, Any]:
    """The JobSet CustomResourceDefinition as shipped (what a cluster with it serves)."""
    path = crd_path()
    if path is None:
        where = os.environ.get(CRD_ENV) or "(unset)"
        missing = (
            f"JobSet CRD schema not found, the JobSet schema tests did not run: set ${CRD_ENV} "
            f"(now {where}) or put the CRD at {DEFAULT_CRD} (kubernetes-sigs/jobset "
            "config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml)"
        )
        if os.environ.get("CI"):  # CI always has ../shared: a missing CRD there is a fault
            pytest.fail(f"CI is set: {missing}")
        pytest.skip(missing)
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crd = yaml.load(path.read_text(), Loader=loader)
    version = crd["spec"]["versions"][0]
    assert version["name"] == "v1alpha2", f"{path}: first version is {version['name']}"
    return crd


@pytest.fixture(scope="session")
def crd_schema(crd_document: dict[str, Any]) -> dict[str, Any]:
    """The CRD's openAPIV3Schema as shipped (Kubernetes' own, lenient view)."""
    return crd_document["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


@pytest.fixture(scope="session")
def older_crd_document(crd_document: dict[str, Any]) -> dict[str, Any]:
    """The CRD as a JobSet release before v0.10 had it: its failure policy rules without
    ``onJobFailureMessagePatterns`` (v0.10 added it)."""
    old = copy.deepcopy(crd_document)
    spec = old["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rule = spec["properties"]["failurePolicy"]["properties"]["rules"]["items"]
    del rule["properties"]["onJobFailureMessagePatterns"]
    return old


def pruned(obj: Any, schema: dict[str, Any], path: str, dropped: list[str]) -> Any:
    """`obj` as the apiserver stores it under a structural `schema`: fields the schema does
    not list are dropped (their paths appended to `dropped`), except under
    x-kubernetes-preserve-unknown-fields or a map's additionalProperties."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return obj
    if isinstance(obj, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        if props is None and not isinstance(extra, dict):
            return obj
        kept = {}
        for key, value in obj.items():
            where = f"{path}.{key}" if path else key
            if props is not None and key in props:
                kept[key] = pruned(value, props[key], where, dropped)
            elif isinstance(extra, dict):
                kept[key] = pruned(value, extra, where, dropped)
            else:
                dropped.append(where)
        return kept
    if isinstance(obj, list) and isinstance(schema.get("items"), dict):
        return [pruned(v, schema["items"], f"{path}[{i}]", dropped) for i, v in enumerate(obj)]
    return obj


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
def recorded_status():
    """Load a recorded JobSet object from fixtures/ by file name."""

    def load(name: str) -> dict[str, Any]:
        return json.loads((FIXTURES / name).read_text())

    return load


class FakeKubeApi:
    """A stand-in Kubernetes API server for JobSets only, over plain HTTP on 127.0.0.1.

    It answers what the provider's GKE operators and hooks send (create, get, delete of
    ``/apis/jobset.x-k8s.io/v1alpha2/namespaces/<ns>/jobsets[/<name>]``) like the apiserver
    does (201, 409 AlreadyExists, 404 NotFound; a DELETE whose DeleteOptions' UID precondition
    names another object: 409, nothing deleted), and serves each JobSet's ``status`` from a
    script: the i-th GET of a JobSet gets ``statuses[i]`` (the last one repeats), or from
    ``scripts[prefix]`` for JobSets whose name starts with that prefix. `requests` records
    (method, path, Authorization header) in order; `deleted` the names deleted.

    Outages: while ``get_failure(path)`` returns a status code, a GET is answered with it (a
    Kubernetes Status object, as the apiserver or its load balancer sends), counted in
    `failed_gets`; while `refuse` is set, `endpoint()` (what the cluster lookup returns) is a
    port nobody listens on: connection refused. Pods: ``GET /api/v1/namespaces/<ns>/pods``
    returns `pods` (a PodList).

    The JobSet CRD `crd` is served at its apiextensions path (None: 404, JobSet not
    installed), and a create is checked against its schema as the apiserver does: a field the
    schema does not have is pruned, or refused (400) under ``fieldValidation=Strict``; a value
    of the wrong type is 422. A created object gets a ``metadata.uid``.
    """

    PREFIX = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/"
    CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/jobsets.jobset.x-k8s.io"

    def __init__(self, crd: dict[str, Any] | None) -> None:
        import socket
        import threading
        import uuid
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from urllib.parse import parse_qs, urlsplit

        self.crd = crd
        self.refuse = False
        with socket.socket() as probe:  # a port that was free: connecting to it is refused
            probe.bind(("127.0.0.1", 0))
            self.dead_url = f"http://127.0.0.1:{probe.getsockname()[1]}"
        self.field_validation: list[str | None] = []  # of each create, in order
        self.pruned: list[str] = []  # fields dropped by non-strict creates
        self.created: list[dict[str, Any]] = []  # the bodies of the creates that succeeded
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.statuses: list[dict[str, Any] | None] = [None]
        self.scripts: dict[str, list[dict[str, Any] | None]] = {}
        self.deleted: list[str] = []
        self.delete_preconditions: list[str | None] = []  # each DELETE's UID precondition
        self.requests: list[tuple[str, str, str | None]] = []
        self.fail_posts: list[int] = []  # status codes for the next POSTs, consumed in order
        self.get_failure: Callable[[str], int | None] = lambda path: None
        self.failed_gets = 0
        self.pods: dict[str, Any] = {"apiVersion": "v1", "kind": "PodList", "items": []}
        self._gets: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, code: int, obj: dict[str, Any]) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _route(self) -> tuple[str, str | None] | None:
                path = urlsplit(self.path).path
                if not path.startswith(api.PREFIX):
                    return None
                parts = path[len(api.PREFIX) :].split("/")
                if len(parts) == 2 and parts[1] == "jobsets":
                    return parts[0], None
                if len(parts) == 3 and parts[1] == "jobsets":
                    return parts[0], parts[2]
                return None

            def _status(self, code: int, reason: str, message: str = "") -> None:
                self._reply(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                   "reason": reason, "code": code, "message": message})  # fmt: skip

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                route = self._route()
                with api._lock:
                    api.requests.append(("POST", self.path, self.headers.get("Authorization")))
                    if route is None or route[1] is not None:
                        return self._status(404, "NotFound")
                    if api.fail_posts:
                        return self._status(api.fail_posts.pop(0), "ServiceUnavailable")
                    mode = parse_qs(urlsplit(self.path).query).get("fieldValidation", [None])[0]
                    api.field_validation.append(mode)
                    if api.crd is None:
                        return self._status(404, "NotFound", "the server could not find the "
                                            "requested resource")  # fmt: skip
                    schema = api.crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
                    dropped: list[str] = []
                    stored = pruned(body, schema, "", dropped)
                    if dropped and mode == "Strict":
                        unknown = ", ".join(f'unknown field "{d}"' for d in dropped)
                        return self._status(400, "BadRequest", f"strict decoding error: {unknown}")
                    api.pruned += dropped
                    invalid = api.schema_errors(stored)
                    if invalid:
                        return self._status(422, "Invalid", "; ".join(invalid))
                    key = (route[0], body["metadata"]["name"])
                    if key in api.objects:
                        return self._status(409, "AlreadyExists")
                    stored["metadata"]["uid"] = str(uuid.uuid4())
                    api.objects[key] = stored
                    api.created.append(body)
                self._reply(201, stored)

            def do_GET(self) -> None:
                route = self._route()
                with api._lock:
                    api.requests.append(("GET", self.path, self.headers.get("Authorization")))
                    failure = api.get_failure(self.path)
                    if failure is not None:
                        api.failed_gets += 1
                        return self._status(failure, "ServiceUnavailable")
                    if urlsplit(self.path).path == api.CRD_PATH:
                        if api.crd is None:
                            return self._status(404, "NotFound")
                        return self._reply(200, api.crd)
                    if self.path.startswith("/api/v1/namespaces/") and "/pods?" in self.path:
                        return self._reply(200, api.pods)
                    if route is None or route[1] is None or route not in api.objects:
                        return self._status(404, "NotFound")
                    count = api._gets.get(route, 0)
                    api._gets[route] = count + 1
                    script = next(
                        (v for k, v in api.scripts.items() if route[1].startswith(k)), api.statuses
                    )
                    status = script[min(count, len(script) - 1)]
                    obj = copy.deepcopy(api.objects[route])
                if status is not None:
                    obj["status"] = status
                self._reply(200, obj)

            def do_DELETE(self) -> None:
                route = self._route()
                length = int(self.headers.get("Content-Length") or 0)
                options = json.loads(self.rfile.read(length) or b"{}") if length else {}
                want = (options.get("preconditions") or {}).get("uid")
                with api._lock:
                    api.requests.append(("DELETE", self.path, self.headers.get("Authorization")))
                    api.delete_preconditions.append(want)
                    if route is None or route not in api.objects:
                        return self._status(404, "NotFound")
                    have = api.objects[route]["metadata"].get("uid")
                    if want is not None and want != have:
                        said = f"UID in precondition: {want}, UID in object meta: {have}"
                        return self._status(409, "Conflict", f"Precondition failed: {said}")
                    del api.objects[route]
                    api.deleted.append(route[1])
                self._reply(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})

        self._checker: Any = None
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def endpoint(self) -> str:
        """The URL the cluster lookup gives: this server, or a refused port while `refuse`."""
        return self.dead_url if self.refuse else self.url

    def schema_errors(self, obj: dict[str, Any]) -> list[str]:
        assert self.crd is not None
        if self._checker is None or self._checker[0] is not self.crd:
            schema = self.crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
            self._checker = (self.crd, SchemaCheck(schema))
        return list(self._checker[1].errors(obj))

    def methods(self) -> list[str]:
        return [method for method, _, _ in self.requests]


@pytest.fixture
def fake_kube_api(crd_document: dict[str, Any]):
    api = FakeKubeApi(crd_document)
    try:
        yield api
    finally:
        api.close()


# A Google connection with no credentials in it (the tests replace the credentials).
GOOGLE_CONN_ENV = {
    "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT": json.dumps({"conn_type": "google_cloud_platform"})
}


@pytest.fixture
def fake_gke(fake_kube_api: FakeKubeApi, monkeypatch: pytest.MonkeyPatch) -> FakeKubeApi:
    """`fake_kube_api` as the GKE cluster of the provider's hooks: cluster lookup returns its
    URL, Google credentials are a fixed token (the only parts not exercised for real)."""
    set_env(monkeypatch, GOOGLE_CONN_ENV)
    from airflow.providers.google.cloud.operators.kubernetes_engine import GKEClusterAuthDetails
    from airflow.providers.google.common.hooks.base_google import GoogleBaseHook

    monkeypatch.setattr(
        GKEClusterAuthDetails, "fetch_cluster_info", lambda self: (fake_kube_api.endpoint(), "")
    )
    monkeypatch.setattr(
        GoogleBaseHook,
        "get_credentials_and_project_id",
        lambda self: (FixedTokenCredentials(), "test-project"),
    )
    return fake_kube_api


class FixedTokenCredentials(google.auth.credentials.Credentials):
    """Google credentials whose refresh yields ``test-token`` without any network."""

    def refresh(self, request: Any) -> None:
        self.token = "test-token"


@pytest.fixture
def sim_clock(monkeypatch: pytest.MonkeyPatch) -> Any:
    from jobset_watch import SimClock

    from tasks.backend_api import watch_trigger

    clock = SimClock()
    monkeypatch.setattr(watch_trigger, "_now", clock.time)
    monkeypatch.setattr(watch_trigger, "_sleep", clock.sleep)
    return clock
