"""The GKE path on real pods: a kubelet on containerd (`devtools.servers.container_node`) joins
the real control plane as a TPU v5p host, and the JobSets that `render_jobset` writes run the
job image built from docker/Dockerfile.tpu (`devtools.servers.container_images`) as real
containers. Asserted from the node and the pods' real status, not from kwok:

- deleting a training JobSet (the verdict's cancel, a stop request) SIGTERMs the trainer, PID 1
  of its container: it exits 143 well inside the grace period with its last manifest row
  naming a saved checkpoint;
- a cancelled evaluation exits 143 and removes its in-progress record
  (``eval/step_N/evaluating.json``), so retention does not keep that checkpoint for it;
- a container killed by its memory limit exits 137, which the JobSet failure policy restarts,
  counted (docs/exit-codes.md: "other"), until ``maxRestarts`` fails it;
- a Secret mounted as a file and a Secret key in the environment reach the job, with its
  working directory, user and the renderer's variables; its output is read back through the
  API server (``pods/log``: the kubelet serves it).

Pods outside the host network have a namespace of their own holding only loopback; nothing
listens or connects outside 127.0.0.0/8. Skipped only where the kubelet binary of
``../shared/k8s-bin/node-v1.36.3/`` (or the control plane's binaries) is missing.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from k8s_planes import Planes
from k8s_real import JobSets, fresh_namespace

from devtools.k8s.control_plane import ControlPlane
from devtools.servers.container_images import NodeImages, node_images
from devtools.servers.container_node import NODE_BIN, ClusterDns, KubeNode, kubelet_binary
from tasks.backends.gke.render import render_jobset
from tasks.backends.gke.settings import GkeSettings, TpuJobShape

pytestmark = pytest.mark.timeout(1800)

GRACE_S = 30
TRAIN = ["python", "-m", "tpu_jobs.train", "--seed", "1", "--global-batch-size", "16"]
BIG_POLICY = ["--d-model", "1024", "--d-ff", "4096", "--num-layers", "8"]


def shape(topology: str = "2x2x1", *, max_restarts: int = 0) -> TpuJobShape:
    # requests this 2-core machine can hold (the defaults ask for 8 CPUs and 32 GiB)
    return TpuJobShape(
        accelerator="tpu-v5p-slice",
        topology=topology,
        slices=1,
        chips_per_host=4,
        max_restarts=max_restarts,
        termination_grace_period_s=GRACE_S,
        cpu_request="100m",
        memory_request="128Mi",
    )


def gke_settings(
    namespace: str, image: str, runs: Path | None = None, **kwargs: Any
) -> GkeSettings:
    volumes = list(kwargs.pop("volumes", ()))
    mounts = list(kwargs.pop("volume_mounts", ()))
    if runs is not None:
        volumes.append({"name": "runs", "hostPath": {"path": str(runs), "type": "Directory"}})
        mounts.append({"name": "runs", "mountPath": "/runs"})
    return GkeSettings(
        namespace=namespace,
        image=image,
        train=kwargs.pop("train", shape()),
        evaluate=kwargs.pop("evaluate", shape()),
        volumes=tuple(volumes),
        volume_mounts=tuple(mounts),
        **kwargs,
    )


@pytest.fixture(scope="module")
def images() -> NodeImages:
    if kubelet_binary() is None:
        pytest.skip(f"the real-pod tests did not run: no kubelet at {NODE_BIN / 'kubelet'}")
    return node_images()


@pytest.fixture(scope="module")
def plane(planes: Planes, images: NodeImages) -> ControlPlane:
    """A control plane of its own whose only node is the real one (no kwok host matches)."""
    return planes(pools=())


@pytest.fixture(scope="module")
def dns(plane: ControlPlane) -> Iterator[ClusterDns]:
    with ClusterDns(plane) as running:
        yield running


@pytest.fixture(scope="module")
def node(plane: ControlPlane, images: NodeImages, dns: ClusterDns) -> Iterator[KubeNode]:
    with KubeNode(
        plane,
        images=[images.archive],
        pause_image=f"docker.io/library/{images.pause}",
        cluster_dns=dns.address,
    ) as running:
        yield running


@pytest.fixture
def namespace(plane: ControlPlane, node: KubeNode) -> Iterator[str]:
    with fresh_namespace(plane) as name:
        yield name


@pytest.fixture
def jobsets(plane: ControlPlane) -> JobSets:
    return JobSets.for_plane(plane)


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    folder = tmp_path / "runs"
    folder.mkdir()
    return folder


@pytest.fixture
def run_settings(namespace: str, images: NodeImages, runs: Path) -> GkeSettings:
    """The test namespace's settings running the job image, `runs` mounted at /runs."""
    return gke_settings(namespace, images.job, runs)


class PodWatch:
    """Every container state the API server reports for a namespace's pods (a watch in a
    thread): a pod deleted with its JobSet is gone soon after its container ends, and only
    its last status update shows the exit code."""

    def __init__(self, plane: ControlPlane, namespace: str) -> None:
        import kubernetes

        self.client = kubernetes.config.new_client_from_config(str(plane.kubeconfig))
        self.core = kubernetes.client.CoreV1Api(self.client)
        self.namespace = namespace
        self.terminated: dict[str, dict[str, Any]] = {}
        self.restarts: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import kubernetes

        while not self._stop.is_set():
            watch = kubernetes.watch.Watch()
            try:
                for event in watch.stream(
                    self.core.list_namespaced_pod, self.namespace, timeout_seconds=5
                ):
                    pod = event["object"]
                    for status in pod.status.container_statuses or []:
                        self.restarts[pod.metadata.name] = status.restart_count
                        if status.state.terminated is not None:
                            term = status.state.terminated
                            self.terminated[pod.metadata.name] = {
                                "exit_code": term.exit_code,
                                "reason": term.reason,
                            }
                    if self._stop.is_set():
                        break
            except Exception:  # a watch that broke is opened again
                time.sleep(0.2)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)
        self.client.close()

    def wait_terminated(self, pod: str, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while pod not in self.terminated:
            if time.monotonic() > deadline:
                raise AssertionError(f"pod {pod}: no terminated container within {timeout_s}s")
            time.sleep(0.1)
        return self.terminated[pod]


@pytest.fixture
def pod_watch(plane: ControlPlane, namespace: str) -> Iterator[PodWatch]:
    watch = PodWatch(plane, namespace)
    try:
        yield watch
    finally:
        watch.close()


def _manifest(run: Path) -> list[dict[str, Any]]:
    path = run / "mllog" / "eval_checkpoints.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _wait(check: Any, timeout_s: float, what: str, node: KubeNode) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:.0f}s\n{node.tail()}")
        time.sleep(0.2)


def _running_pod(jobsets: JobSets, namespace: str, name: str, node: KubeNode) -> dict[str, Any]:
    try:
        (pod,) = jobsets.running_pods(namespace, name, 1, timeout_s=120)
    except Exception as exc:
        raise AssertionError(f"{exc}\n--- kubelet:\n{node.tail()}") from None
    assert pod["spec"]["nodeName"] == node.name
    return pod


def _render(s: GkeSettings, role: str, job: str, command: list[str], **kw: Any) -> dict[str, Any]:
    return render_jobset(
        s,
        role=role,  # type: ignore[arg-type]
        dag_id="rcp",
        run_id=f"manual__{job}",
        job=job,
        command=command,
        **kw,
    )


def _delete_when(
    jobsets: JobSets,
    pod_watch: PodWatch,
    node: KubeNode,
    jobset: dict[str, Any],
    ready: Callable[[], object],
    what: str,
) -> float:
    """Create `jobset`, wait for its pod running and then for `ready`, delete the JobSet
    (Foreground: the Jobs, then their pods): its pod must exit 143, SIGTERM handled (137: killed
    after the grace). The seconds from the delete to the pod's end."""
    namespace, name = jobset["metadata"]["namespace"], jobset["metadata"]["name"]
    jobsets.create(jobset)
    pod = _running_pod(jobsets, namespace, name, node)
    _wait(ready, 120, what, node)
    started = time.monotonic()
    jobsets.delete(namespace, name)
    ended = pod_watch.wait_terminated(pod["metadata"]["name"], GRACE_S + 30)
    stopped_s = time.monotonic() - started
    assert ended["exit_code"] == 143, ended
    return stopped_s


def test_the_node_is_a_tpu_host_of_the_real_control_plane(
    plane: ControlPlane, node: KubeNode
) -> None:
    obj = plane.api.get(f"/api/v1/nodes/{node.name}")
    labels = obj["metadata"]["labels"]
    assert labels["cloud.google.com/gke-tpu-accelerator"] == "tpu-v5p-slice"
    assert labels["cloud.google.com/gke-tpu-topology"] == "2x2x1"
    assert obj["status"]["capacity"]["google.com/tpu"] == "4"
    assert obj["status"]["nodeInfo"]["kubeletVersion"] == "v1.36.3"
    assert obj["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    addresses = {a["type"]: a["address"] for a in obj["status"]["addresses"]}
    assert addresses["InternalIP"].startswith("127."), addresses


def test_deleting_a_training_jobset_sigterms_the_trainer_which_writes_its_last_row(
    node: KubeNode, jobsets: JobSets, pod_watch: PodWatch, runs: Path, run_settings: GkeSettings
) -> None:
    s = run_settings
    train = [*TRAIN, "--run-dir", "/runs/seed_1", "--max-steps", "400", "--val-start-at", "1"]
    stopped_s = _delete_when(
        jobsets, pod_watch, node, _render(s, "train", "train", train),
        lambda: len(_manifest(runs / "seed_1")) >= 2, "two manifest rows",
    )  # fmt: skip
    assert stopped_s < GRACE_S, "the trainer waited for SIGKILL"
    steps = [int(row["step"]) for row in _manifest(runs / "seed_1")]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) < 400
    saved = {int(p.name) for p in (runs / "seed_1" / "checkpoints").iterdir() if p.name.isdigit()}
    assert steps[-1] in saved, (steps, saved)


def test_a_cancelled_evaluation_removes_its_in_progress_record(
    node: KubeNode, jobsets: JobSets, pod_watch: PodWatch, runs: Path, run_settings: GkeSettings
) -> None:
    s = run_settings
    # a policy large enough that evaluating its checkpoint takes about 10 s here
    train = [*TRAIN, "--run-dir", "/runs/seed_1", "--max-steps", "1", "--val-start-at", "1"]
    trained = _render(s, "train", "train", [*train, *BIG_POLICY])
    jobsets.create(trained)
    jobsets.wait_condition(s.namespace, trained["metadata"]["name"], "Completed", timeout_s=180)
    evaluate = ["python", "-m", "tpu_jobs.evaluate", "--run-dir", "/runs/seed_1", "--step", "1"]
    evaluating = runs / "seed_1" / "eval" / "step_1" / "evaluating.json"
    _delete_when(
        jobsets, pod_watch, node, _render(s, "evaluate", "eval-1", evaluate),
        evaluating.exists, "evaluating.json written",
    )  # fmt: skip
    assert not evaluating.exists(), "the cancelled evaluation left its in-progress record"
    assert not (evaluating.parent / "summary.json").exists()


def test_an_oom_killed_container_exits_137_and_restarts_counted_until_max_restarts(
    plane: ControlPlane,
    node: KubeNode,
    namespace: str,
    jobsets: JobSets,
    pod_watch: PodWatch,
    images: NodeImages,
) -> None:
    s = gke_settings(namespace, images.job, train=shape(max_restarts=1))
    jobset = _render(s, "train", "oom", ["python", "-c", "b = bytearray(400 << 20); print(len(b))"])
    # the renderer sets no memory limit (a job is never OOM-killed below the host); this pod
    # gets one so that the kernel kills it as it would at the host's
    container = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"
    ][0]
    container["resources"]["limits"]["memory"] = "64Mi"
    container["resources"]["requests"]["memory"] = "64Mi"
    name = jobset["metadata"]["name"]
    jobsets.create(jobset)
    failed = jobsets.wait_condition(namespace, name, "Failed", timeout_s=240)["status"]
    assert failed["restarts"] == 1 and int(failed.get("restartsCountTowardsMax") or 0) == 1
    [reason] = [c for c in failed["conditions"] if c["type"] == "Failed"]
    assert reason["reason"] == "ReachedMaxRestarts", reason
    codes = sorted(t["exit_code"] for t in pod_watch.terminated.values())
    reasons = {t["reason"] for t in pod_watch.terminated.values()}
    assert codes == [137, 137] and reasons == {"OOMKilled"}, pod_watch.terminated


def test_secrets_environment_and_logs_through_the_api(
    plane: ControlPlane,
    node: KubeNode,
    namespace: str,
    jobsets: JobSets,
    images: NodeImages,
) -> None:
    from tasks.jobs.templates import SecretKeyRef

    plane.api.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/secrets",
        {
            "metadata": {"name": "creds"},
            "stringData": {"token.json": '{"token": "s3cret"}', "key": "k3y"},
        },
    )
    s = gke_settings(
        namespace,
        images.job,
        volumes=[{"name": "creds", "secret": {"secretName": "creds", "defaultMode": 0o400}}],
        volume_mounts=[{"name": "creds", "mountPath": "/var/secrets/creds", "readOnly": True}],
    )
    probe = (
        "import json, os, stat; p = '/var/secrets/creds/token.json'; "
        "print(json.dumps({'file': json.load(open(p)), "
        "'mode': oct(stat.S_IMODE(os.stat(os.path.realpath(p)).st_mode)), "
        "'env': os.environ['RCPFLOW_KEY'], 'cwd': os.getcwd(), 'uid': os.getuid(), "
        "'attempt': os.environ['RCPFLOW_ATTEMPT_ID'], 'literal': os.environ['LITERAL'], "
        "'ifaces': sorted(os.listdir('/sys/class/net'))}))"
    )
    jobset = _render(
        s,
        "train",
        "probe",
        ["python", "-c", probe],
        env={"LITERAL": "$(RCPFLOW_KEY)"},
        secret_env={"RCPFLOW_KEY": SecretKeyRef(secret="creds", key="key")},
    )
    name = jobset["metadata"]["name"]
    created = jobsets.create(jobset)
    jobsets.wait_condition(namespace, name, "Completed", timeout_s=120)
    [pod] = jobsets.pods(namespace, name)
    log = plane.api.request(
        "GET", f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}/log"
    )
    text = log if isinstance(log, str) else json.dumps(log)
    found = json.loads(text.strip().splitlines()[-1]) if isinstance(log, str) else log
    assert found["file"] == {"token": "s3cret"}
    assert found["mode"] == "0o400"
    assert found["env"] == "k3y"
    assert found["literal"] == "$(RCPFLOW_KEY)"  # the renderer's escaping: no expansion
    assert found["cwd"] == "/opt/rcpflow" and found["uid"] == 0
    assert found["attempt"] == f"{created['metadata']['uid']}/0"
    assert found["ifaces"] == ["lo"], "a pod off the host network has only loopback"


def test_multi_host_training_two_pods_find_their_coordinator_by_the_jobsets_name(
    plane: ControlPlane,
    node: KubeNode,
    namespace: str,
    jobsets: JobSets,
    pod_watch: PodWatch,
    runs: Path,
    images: NodeImages,
) -> None:
    """Two pods of one replicated Job (topology 2x2x2: two hosts of 4 chips), on the host
    network, initialise jax.distributed through the coordinator name JobSet gives them
    (``<jobset>-slice-0-0.<jobset>``, resolved by the cluster DNS from the headless Service's
    EndpointSlice) and train together."""
    node.relabel({"cloud.google.com/gke-tpu-topology": "2x2x2"})
    node.set_tpu_chips(8)  # both hosts' chips on the one node
    try:
        s = gke_settings(namespace, images.job, runs, train=shape("2x2x2"))
        # 32 generations: 2 prompt rows a step, one per process
        train = [*TRAIN, "--run-dir", "/runs/seed_1", "--max-steps", "3", "--val-start-at", "1"]
        train[train.index("--global-batch-size") + 1] = "32"
        jobset = _render(s, "train", "mh", train)
        name = jobset["metadata"]["name"]
        jobsets.create(jobset)
        try:
            done = jobsets.wait_status(
                namespace,
                name,
                lambda st: any(
                    c["type"] in ("Completed", "Failed") and c["status"] == "True"
                    for c in st.get("conditions") or []
                ),
                "finished",
                timeout_s=240,
            )
        except Exception:
            state = [
                (p["metadata"]["name"], p["spec"].get("nodeSelector"), p.get("status"))
                for p in plane.pods(namespace)
            ]
            job_log = "\n".join(
                line
                for line in plane.components["kube-controller-manager"].tail(400).splitlines()
                if "job" in line.lower()
            )[-3000:]
            raise AssertionError(f"{json.dumps(state)[:4000]}\n{job_log}") from None
        pods = jobsets.pods(namespace, name)
        logs = {
            p["metadata"]["name"]: plane.api.request(
                "GET", f"/api/v1/namespaces/{namespace}/pods/{p['metadata']['name']}/log"
            )
            for p in pods
        }
        finished = [c["type"] for c in done["status"]["conditions"] if c["status"] == "True"]
        assert "Completed" in finished, (finished, logs, node.tail())
        assert len(pods) == 2 and all(p["spec"]["hostNetwork"] for p in pods)
        coordinator = f"{name}-slice-0-0.{name}"
        assert {p["metadata"]["annotations"]["jobset.sigs.k8s.io/coordinator"] for p in pods} == {
            coordinator
        }
        assert sorted(t["exit_code"] for t in pod_watch.terminated.values()) == [0, 0]
        assert [int(row["step"]) for row in _manifest(runs / "seed_1")] == [1, 2, 3]
    finally:
        node.relabel({"cloud.google.com/gke-tpu-topology": node.topology})
        node.set_tpu_chips(4)


@pytest.mark.slow
def test_a_whole_run_of_the_gke_path_on_real_pods(
    plane: ControlPlane,
    node: KubeNode,
    namespace: str,
    pod_watch: PodWatch,
    images: NodeImages,
    tmp_path: Path,
) -> None:
    """A whole run (one seed) of the rehearsal jobs (docker/deployment.rehearsal.toml's, on the
    GKE backend) under a real Airflow scheduler, every job a JobSet of the job image run as
    real pods on the node: the run DAG trains, evaluates, stops at its first passing step (the
    higher steps' evaluations deleted: their pods SIGTERMed), tears everything down, and its
    MLLOG passes the compliance checker. (The three-seed submission and its checkers run on
    kwok's pods: test_real_submission.py.)"""
    from k8s_real import (
        CONF,
        airflow_env,
        gke_rehearsal_deployment,
        wait_namespace_empty,
    )

    from devtools.servers.airflow_server import LocalAirflow, repo_config
    from rcpflow.files.layout import RunLayout
    from rcpflow.records.mllog import read_events
    from tasks.names import RUN_DAG_ID
    from tasks.results.verdicts import read_verdict

    runs = tmp_path / "runs"
    runs.mkdir()
    text = gke_rehearsal_deployment(runs, namespace).replace("rcpflow-rehearsal:test", images.job)
    text = text.replace('cpu_request = "1"', 'cpu_request = "100m"')
    text = text.replace('memory_request = "1Gi"', 'memory_request = "256Mi"')
    mount = (
        f'volumes = [{{ name = "runs", hostPath = {{ path = "{runs}", type = "Directory" }} }}]\n'
        f'volume_mounts = [{{ name = "runs", mountPath = "{runs}" }}]\n'
    )
    text = text.replace("ttl_after_finished_s = 600\n", "ttl_after_finished_s = 600\n" + mount)
    deployment = tmp_path / "deployment.toml"
    deployment.write_text(text)
    env = airflow_env(plane, namespace, deployment)
    run_dir = runs / "seed_1"
    conf = {**CONF, "seed": 1, "run_dir": str(run_dir), "division": "open"}
    airflow = LocalAirflow(repo_config(tmp_path / "airflow", parallelism=4, env=env))
    with airflow:
        airflow.wait_for_dag(RUN_DAG_ID)
        run_id = airflow.trigger(RUN_DAG_ID, conf)
        state = airflow.wait_for_run(RUN_DAG_ID, run_id, timeout_s=900)
        states = {
            (t["task_id"], t["map_index"]): t["state"]
            for t in airflow.task_instances(RUN_DAG_ID, run_id)
        }
        wait_namespace_empty(plane, namespace)
    assert state == "success", states
    (stop,) = [e for e in read_events(RunLayout(str(run_dir)).mllog(1)) if e.key == "run_stop"]
    assert stop.metadata["status"] == "success"
    verdict = read_verdict(str(run_dir), "compliance_checker")
    assert verdict is not None and verdict.ok, verdict
    # Every job ran as a real container: the training ended 0, each evaluation 0 or 143 (a
    # higher step's evaluation deleted at the pass, its SIGTERM handled by the job).
    exits = {pod: t["exit_code"] for pod, t in pod_watch.terminated.items()}
    trainings = [code for pod, code in exits.items() if "-train-" in pod]
    assert trainings == [0], exits
    assert len(exits) > 1 and set(exits.values()) <= {0, 143}, exits
