"""The GKE backend on the distributed Airflow: the rehearsal deployment of the real-control-plane
test (``tests/tasks/backends/gke/real/test_real_submission.py``, its helpers in
``k8s_real.py``) under the CeleryExecutor (`distributed_cluster.build_airflow`: two schedulers,
two Celery workers: worker-1 in a mount and PID namespace of its own over this checkout,
worker-2 a container of the Airflow image, `IMAGE_WORKER`), every job a JobSet the real
JobSet controller runs on kwok's TPU v5p nodes, each pod's container run here by
`devtools.k8s.kwok_pods.PodRunner`: its whole 3-seed submission, then the faults of
`fault_scenarios` against its seed 1.

What the workers share is what a GKE deployment's workers share: the run folders on ``gs://``
(the GCS emulator, fake-gcs-server, reached through ``STORAGE_EMULATOR_HOST`` by every
component and every pod), the database, the broker, and the cluster through a Kubernetes
connection whose kubeconfig is held inline in the connection (its CA inlined too): no file of
the control plane's folder is visible to a worker. Only the deployment file's folder and the
hook's are bound into the workers' private /tmp (into the image worker's container at their
paths: it sees nothing of this checkout).

The image worker runs the image's own rcpflow, DAGs and plugins as the Helm chart's workers do
(``docker run --network host`` of docker/Dockerfile.airflow's image on a private dockerd,
`container_images.Docker`, started before the Airflow and stopped after it), on the default
queue beside worker-1: the submission test asserts from the task instances' hostnames that
tasks ran and succeeded in it. It takes the faults too: the hook is on its PYTHONPATH (the
hook's folder bound in, writable by its uid 50000), so when it holds the training it is the
worker killed, by ``docker kill`` (a host lost), and started again as a new container.

The faults' hook point is the JobSet create (`CREATE_HOOK`, a ``sitecustomize`` first on the
workers' PYTHONPATH, as the Slurm tests' is a ``sbatch`` first on their PATH): when the test
armed it, the worker's task is held right after the API server accepted the run's training
JobSet, before Airflow recorded it, and the runner holds the JobSet's pod (`PodRunner.hold`).

The control plane is the session's (`k8s_planes.planes`: this module runs in the
real-control-plane tests' xdist group, tests/conftest.py), skipped with its named reason where
its binaries are missing."""

from __future__ import annotations

import base64
import collections
import json
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from distributed_cluster import (
    assert_evaluations_on_every_worker,
    assert_every_checker_passed,
    build_airflow,
    running,
    unavailable,
)
from fault_scenarios import (
    EVALUATE,
    SEED,
    FaultTarget,
    scheduler_killed_and_broker_restarted,
    worker_killed_then_triggerer_lost,
)
from k8s_planes import Planes
from k8s_real import (
    CONF,
    CONN_ID,
    POOLS,
    SEEDS,
    JobSets,
    connection_kubeconfig,
    fresh_namespace,
    gke_rehearsal_deployment,
    rehearsal_conf,
    wait_namespace_empty,
)
from repo_paths import REPO

from devtools.k8s.binaries import NEWEST_JOBSET
from devtools.k8s.control_plane import ControlPlane
from devtools.k8s.kwok_pods import PodRunner
from devtools.servers import container_images
from devtools.servers.container_images import Docker
from devtools.servers.distributed_airflow import WORKERS, DistributedAirflow, WorkerSpec
from rcpflow.files.layout import RunLayout
from rcpflow.records.manifest import load
from tasks.backend_api.lifecycle_names import eval_label
from tasks.backends.gke.render import (
    JOBSET_GROUP,
    JOBSET_PLURAL,
    JOBSET_VERSION,
    LABEL_RUN,
    jobset_name,
    run_label,
)
from tasks.names import RUN_DAG_ID, SUBMISSION_DAG_ID

NAME = "kwok-celery"
TIMEOUT_S = 1500
# The worker that runs from the Airflow image (module doc): the second of the two.
IMAGE_WORKER = WORKERS[1]


def inline_kubeconfig(path: Path) -> dict[str, Any]:
    """The kubeconfig at `path` with its CA certificate inlined (``certificate-authority-data``):
    a connection that names no file, as a deployment's workers on other hosts need."""
    config: dict[str, Any] = json.loads(path.read_text())  # the harness writes JSON
    for entry in config["clusters"]:
        cluster = entry["cluster"]
        ca = Path(cluster.pop("certificate-authority")).read_bytes()
        cluster["certificate-authority-data"] = base64.b64encode(ca).decode()
    return config


# The faults' hook point in each worker (module doc): the JobSet create of the `kubernetes`
# client (the cncf-kubernetes provider's hook calls it) wrapped at the worker's start.
CREATE_HOOK = """import os, pathlib, time

from kubernetes.client import CustomObjectsApi

HOOKS = pathlib.Path({hooks!r})
_create = CustomObjectsApi.create_namespaced_custom_object


def _held_after_create(self, *args, **kwargs):
    out = _create(self, *args, **kwargs)
    plural = kwargs.get("plural", args[3] if len(args) > 3 else None)
    body = kwargs.get("body", args[4] if len(args) > 4 else None)
    if plural == "jobsets":
        try:
            (HOOKS / "armed").unlink()
        except FileNotFoundError:
            return out
        name = body["metadata"]["name"]
        (HOOKS / "submitted.tmp").write_text(os.environ["{hostname_var}"] + " " + name)
        (HOOKS / "submitted.tmp").rename(HOOKS / "submitted")
        while True:
            try:
                (HOOKS / "release").unlink()
                break
            except FileNotFoundError:
                time.sleep(0.2)
    return out


CustomObjectsApi.create_namespaced_custom_object = _held_after_create
"""


@dataclass(frozen=True)
class GkeDeployment:
    """The module's distributed Airflow on the GKE backend, its cluster and its storage."""

    airflow: DistributedAirflow
    plane: ControlPlane
    namespace: str
    runner: PodRunner
    storage: str  # gs://...: the deployment's storage_root
    hooks: Path  # the create hook's folder (CREATE_HOOK)


@dataclass(frozen=True)
class GkeSubmission:
    """The undisturbed submission, as seen when it ended."""

    run_id: str
    state: str
    runs: dict[int, str]  # seed -> run id of its mlperf_grpo_run
    run_states: dict[int, str]
    run_tis: list[dict[str, Any]]
    report: str
    left_running: list[str]  # pods whose process ran on once the namespace was empty
    exits: list[tuple[str, int]]  # the runner's, then


@pytest.fixture(scope="module")
def docker() -> Iterator[Docker]:
    """The private dockerd that runs the image worker, for the whole module (the Airflow's
    start to its stop). One daemon per data root: another module's (tests/docker/ on another
    xdist worker) waits for its lock until this module ends, and this one for theirs."""
    unavailable(container_images.missing_tools(), "the Airflow image's worker")
    with Docker() as daemon:
        yield daemon


@pytest.fixture(scope="module")
def gke(
    planes: Planes, gcs_server: Any, docker: Docker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GkeDeployment]:
    from devtools.servers.distributed_airflow import HOSTNAME_VAR

    image = docker.ensure_image("airflow")
    plane = planes(NEWEST_JOBSET, pools=POOLS)
    storage = f"gs://{gcs_server.bucket}/distributed-gke-{uuid.uuid4().hex[:8]}"
    shared = tmp_path_factory.mktemp("gke-deployment")
    hooks = tmp_path_factory.mktemp("gke-hooks")
    # the image worker runs as uid 50000: it reads the deployment file, and the hook writes
    # and takes its files in the hook's folder
    shared.chmod(0o755)
    hooks.chmod(0o777)
    (hooks / "sitecustomize.py").write_text(
        CREATE_HOOK.format(hooks=str(hooks), hostname_var=HOSTNAME_VAR)
    )
    path = {"PYTHONPATH": f"{hooks}{os.pathsep}{REPO}"}
    workers = tuple(
        # the image worker's rcpflow is the image's: only the hook on its PYTHONPATH
        WorkerSpec(w.name, w.host, w.queues, w.concurrency, {"PYTHONPATH": str(hooks)}, image)
        if w == IMAGE_WORKER
        else WorkerSpec(w.name, w.host, w.queues, w.concurrency, path)
        for w in WORKERS
    )
    with pytest.MonkeyPatch.context() as mp, fresh_namespace(plane) as namespace:
        for key, value in gcs_server.env.items():  # this process reads the run folders too
            mp.setenv(key, value)
        deployment = shared / "deployment.toml"
        deployment.write_text(gke_rehearsal_deployment(storage, namespace))
        kubeconfig = inline_kubeconfig(connection_kubeconfig(plane, namespace))
        conn = {"conn_type": "kubernetes", "extra": {"kube_config": kubeconfig}}
        env = {
            "RCPFLOW_DEPLOYMENT": str(deployment),
            f"AIRFLOW_CONN_{CONN_ID.upper()}": json.dumps(conn),
            **gcs_server.env,
        }
        pods = tmp_path_factory.mktemp("gke-pods")
        runner = PodRunner(plane, namespace, workdir=REPO, log_dir=pods, env=gcs_server.env)
        airflow = build_airflow(
            tmp_path_factory.mktemp("gke-airflow"), env, (shared, hooks), workers, docker
        )
        with runner, running(airflow):
            yield GkeDeployment(airflow, plane, namespace, runner, storage, hooks)
        assert runner.errors == []
    # the image worker's container, however it ended (killed, restarted, stopped), is gone
    assert docker.client("ps", "--all", "--quiet").stdout.split() == []


@pytest.fixture(scope="module")
def gke_submission(gke: GkeDeployment) -> GkeSubmission:
    """The 3-seed rehearsal submission, run once, undisturbed."""
    airflow = gke.airflow
    run_id = airflow.trigger(SUBMISSION_DAG_ID, rehearsal_conf(gke.storage, NAME))
    state = airflow.wait_for_run(SUBMISSION_DAG_ID, run_id, TIMEOUT_S)
    runs = {seed: f"{NAME}__seed_{seed}" for seed in SEEDS}
    run_states = {seed: airflow.dag_run(RUN_DAG_ID, r)["state"] for seed, r in runs.items()}
    run_tis = [t for r in runs.values() for t in airflow.task_instances(RUN_DAG_ID, r)]
    report = "\n".join(
        [airflow.failure_report(SUBMISSION_DAG_ID, run_id)]
        + [airflow.failure_report(RUN_DAG_ID, r) for r in runs.values()]
    )
    # Nothing of the runs is left on the cluster: every JobSet torn down, with its Jobs and
    # pods, and no pod's process still running here.
    wait_namespace_empty(gke.plane, gke.namespace)
    left = gke.runner.running()
    exits = list(gke.runner.exits)
    return GkeSubmission(run_id, state, runs, run_states, run_tis, report, left, exits)


@pytest.mark.slow
@pytest.mark.timeout(40 * 60)
def test_a_three_seed_gke_submission_under_celery_on_gcs_passes_every_checker(
    gke: GkeDeployment, gke_submission: GkeSubmission
) -> None:
    s = gke_submission
    assert s.state == "success", s.report
    assert s.run_states == {seed: "success" for seed in SEEDS}
    assert s.left_running == []
    out = f"{gke.storage}/{NAME}"
    run_dirs = [f"{out}/runs/seed_{seed}" for seed in SEEDS]
    assert_every_checker_passed(out, run_dirs)
    for run_dir in run_dirs:  # the manifest the workers' tasks read lies on gs:// too
        assert load(RunLayout(run_dir).manifest).rows, run_dir
    assert_evaluations_on_every_worker(gke.airflow, s.run_tis)
    # the image worker ran tasks, and none failed (a wait or evaluation past a passing step
    # ends skipped): its image holds what they need
    in_image = [t for t in s.run_tis if t["hostname"] == IMAGE_WORKER.host]
    states = collections.Counter(t["state"] for t in in_image)
    assert states["success"] and set(states) <= {"success", "skipped"}, [
        (t["dag_run_id"], t["task_id"], t["map_index"], t["state"]) for t in in_image
    ]
    # its log server serves their logs to the API server, at its address (its hostname)
    ti = next(t for t in in_image if t["state"] == "success")
    text = gke.airflow.task_log(
        RUN_DAG_ID, ti["dag_run_id"], ti["task_id"], ti["map_index"], ti["try_number"]
    )
    assert text and "Could not read served logs" not in text, text[-2000:]
    # Exactly one JobSet per job name: a JobSet is named for its DAG run and job, and each ran
    # one pod (single-host slices, no restart); a JobSet submitted twice under one name, or a
    # restarted one, would show a second pod of that name. The trainings ended 0; an
    # evaluation 0, or 143 when a higher step's evaluation was deleted at a pass.
    jobsets = collections.Counter(pod.rsplit("-", 3)[0] for pod, _ in s.exits)
    assert jobsets and set(jobsets.values()) == {1}, s.exits
    trainings = [code for pod, code in s.exits if "-train-" in pod]
    assert trainings == [0] * len(SEEDS), s.exits
    assert {code for _, code in s.exits} <= {0, 143}, s.exits


@pytest.mark.slow
@pytest.mark.timeout(10 * 60)
def test_the_image_worker_killed_leaves_no_container_and_comes_back(
    gke: GkeDeployment, docker: Docker, gke_submission: GkeSubmission
) -> None:
    """Whichever worker the fault below finds holding the training, the image worker's own
    kill (``docker kill``: a host lost) and restart are shown here, once the submission is
    over (no task of it runs)."""
    airflow, name = gke.airflow, IMAGE_WORKER.name
    # the worker runs under the image's init, as the chart runs it (no docker --init)
    init = docker.client("exec", airflow.container(name), "cat", "/proc/1/cmdline").stdout
    assert init.split("\0")[:4] == ["tini", "--", "sh", "-c"], init
    airflow.kill(name)
    assert docker.client("ps", "--all", "--quiet").stdout.split() == []
    assert name not in airflow.answering_workers()
    airflow.restart(name)
    airflow.wait_workers_answer()


@dataclass(frozen=True)
class GkeFaults(FaultTarget):
    """The GKE path's side of `fault_scenarios.FaultTarget`: a job is a JobSet, known by its
    name; its pods are the runner's."""

    gke: GkeDeployment

    @classmethod
    def of(cls, gke: GkeDeployment, submission: GkeSubmission) -> GkeFaults:
        assert submission.state == "success", submission.report
        return cls(
            gke.airflow,
            gke.hooks,
            submission.runs[SEED],
            f"{gke.storage}/{NAME}/runs/seed_{SEED}",
            f"{gke.storage}/faults",
            gke,
        )

    def arm(self, run_id: str) -> None:
        self.gke.runner.hold(jobset_name(RUN_DAG_ID, run_id, "train"))
        super().arm(run_id)

    def let_job_run(self, run_id: str, job: str) -> None:
        assert job == jobset_name(RUN_DAG_ID, run_id, "train"), job
        self.gke.runner.release(job)

    @staticmethod
    def _prefixes(run_id: str) -> dict[str, str]:
        """label -> the name prefix of the pods of the run's job of that label."""
        labels = ["train", *(eval_label(step) for step in range(1, CONF["max_steps"] + 1))]
        return {label: f"{jobset_name(RUN_DAG_ID, run_id, label)}-" for label in labels}

    def _pods(self, run_id: str) -> dict[str, list[int]]:
        """label -> the exit codes of the run's pods of that job, as the runner saw them."""
        found: dict[str, list[int]] = {}
        for label, prefix in self._prefixes(run_id).items():
            codes = [code for pod, code in self.gke.runner.exits if pod.startswith(prefix)]
            if codes:
                found[label] = codes
        return found

    def training_ended(self, run_id: str) -> bool:
        codes = self._pods(run_id).get("train", [])
        assert codes in ([], [0]), codes
        return bool(codes)

    def assert_undisturbed(self, run_id: str, conf: dict[str, Any], state: str) -> str:
        airflow, gke = self.airflow, self.gke
        tis = airflow.task_instances(RUN_DAG_ID, run_id)
        assert state == "success", airflow.failure_report(RUN_DAG_ID, run_id)
        # every JobSet of the run torn down (with its pods), none left running here
        jobsets = JobSets.for_plane(gke.plane)
        selector = f"{LABEL_RUN}={run_label(RUN_DAG_ID, run_id)}"
        deadline = time.monotonic() + 120
        while left := jobsets.custom.list_namespaced_custom_object(
            JOBSET_GROUP, JOBSET_VERSION, gke.namespace, JOBSET_PLURAL, label_selector=selector
        )["items"]:
            assert time.monotonic() < deadline, [j["metadata"]["name"] for j in left]
            time.sleep(1.0)
        prefixes = tuple(self._prefixes(run_id).values())
        assert not [pod for pod in gke.runner.running() if pod.startswith(prefixes)]
        # one pod per JobSet name: none created twice, none restarted; the training ended 0,
        # an evaluation 0 (143 when a higher step's was deleted at a pass)
        pods = self._pods(run_id)
        assert pods.get("train") == [0], pods
        for label, codes in pods.items():
            assert len(codes) == 1 and codes[0] in (0, 143), (label, codes)
        for t in tis:
            if t["task_id"] == EVALUATE and t["state"] == "success":
                step = int(t["rendered_map_index"].removeprefix("step "))
                assert pods[eval_label(step)] == [0], (step, pods)
        self.assert_same_record(conf)
        return jobset_name(RUN_DAG_ID, run_id, "train")


@pytest.mark.slow
@pytest.mark.timeout(40 * 60)
def test_a_worker_killed_while_its_task_creates_a_jobset_then_the_triggerer_lost(
    gke: GkeDeployment, gke_submission: GkeSubmission
) -> None:
    worker_killed_then_triggerer_lost(GkeFaults.of(gke, gke_submission), "worker_triggerer")


@pytest.mark.slow
@pytest.mark.timeout(40 * 60)
def test_a_scheduler_killed_and_the_broker_restarted_while_a_task_creates_a_jobset(
    gke: GkeDeployment, gke_submission: GkeSubmission
) -> None:
    scheduler_killed_and_broker_restarted(GkeFaults.of(gke, gke_submission), "scheduler_broker")
