"""The submission: Params and their checks, one run per seed, packaging, the checkers, a report.

``plan`` (refuse bad Params, naming them, before anything runs) -> ``run_seed`` (one
``mlperf_grpo_run`` per seed, triggered and waited for) -> ``package`` -> ``rcp_check`` /
``package_check`` / ``result_summary`` (the official tools; each fails on any error it reports
and persists its verdict) -> ``report`` (always runs; writes ``report.md`` from the persisted
verdicts and fails unless every verdict passed).

Two Params are declarations rather than knobs, and are checked as such:

- ``target``: MLPerf Training 6.1 fixes the qwen35_397b_grpo quality target at
  ``eval_accuracy > 0.69`` for both divisions (the checkers enforce it), and the training job
  records it in every manifest row. The Param states the target the submission is meant to be
  judged against; any other value is refused before compute is spent, instead of producing a
  submission the checkers would reject or quietly judging against 0.69 anyway.
- ``backend``: which backend runs the jobs is a deployment setting (the run DAG's tasks differ
  per backend), so the Param must name this deployment's backend; it is recorded in the report.

Layout of one submission under ``<storage_root>/<submission_name>/``: ``runs/seed_<s>/`` (one
run each), ``submission/`` (the package), ``checks/`` (verdicts), ``report.md``.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow.sdk import Param, TriggerRule, XComArg, get_current_context, task

from rcpflow import recipe
from rcpflow.layout import join
from tasks.deployment import BACKENDS, Deployment
from tasks.run_spec import ParamError, RunSpec, check_path, training_params

log = logging.getLogger(__name__)

RUN_DAG_ID = "mlperf_grpo_run"
# The package checker's count of result files for this benchmark.
RUNS_PER_SUBMISSION = 3
DEFAULT_SEEDS = (1, 2, 3)
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
CHECK_TOOLS = ("rcp_checker", "package_checker", "result_summarizer")


@dataclass(frozen=True)
class SubmissionSpec:
    name: str
    out_dir: str
    seeds: tuple[int, ...]
    global_batch_size: int
    max_steps: int
    val_start_at: int | None
    target: float
    division: str
    backend: str
    system: Mapping[str, str]  # overrides of rcpflow.package's system description

    def run_dir(self, seed: int) -> str:
        return join(self.out_dir, "runs", f"seed_{seed}")

    def run_spec(self, seed: int) -> RunSpec:
        return RunSpec(
            run_dir=self.run_dir(seed),
            seed=seed,
            global_batch_size=self.global_batch_size,
            max_steps=self.max_steps,
            val_start_at=self.val_start_at,
            division=self.division,
        )

    def triggers(self) -> list[dict[str, Any]]:
        """Keyword arguments of each mapped TriggerDagRunOperator: a run id per seed, so a
        retry resets that seed's run instead of starting a second one."""
        return [
            {"trigger_run_id": f"{self.name}__seed_{s}", "conf": self.run_spec(s).to_dict()}
            for s in self.seeds
        ]

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["seeds"] = list(self.seeds)
        d["system"] = dict(self.system)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SubmissionSpec:
        return cls(**{**d, "seeds": tuple(d["seeds"]), "system": dict(d["system"])})


def _system_fields() -> list[str]:
    from rcpflow.package import SystemDescription

    return [f.name for f in dataclasses.fields(SystemDescription) if f.name != "division"]


def submission_params(deployment: Deployment) -> dict[str, Param]:
    """Params of mlperf_grpo_submission with JSON schema (fresh objects per DAG)."""
    return {
        "seeds": Param(
            list(DEFAULT_SEEDS),
            type="array",
            items={"type": "integer", "minimum": 0},
            minItems=RUNS_PER_SUBMISSION,
            maxItems=RUNS_PER_SUBMISSION,
            uniqueItems=True,
            title="Seeds",
            description=f"{RUNS_PER_SUBMISSION} distinct seeds: one run each.",
        ),
        **training_params(max_steps=60),
        "target": Param(
            recipe.TARGET_ACCURACY,
            type="number",
            minimum=0,
            maximum=1,
            title="Quality target (fixed by the rules)",
            description=(
                f"eval_accuracy (pass@4) must exceed this; MLPerf {recipe.RULESET} fixes it at "
                f"{recipe.TARGET_ACCURACY} in both divisions, other values are refused."
            ),
        ),
        "backend": Param(
            deployment.backend,
            type="string",
            enum=list(BACKENDS),
            title="Backend",
            description=f"Must be this deployment's backend ({deployment.backend}).",
        ),
        "storage_root": Param(
            deployment.storage_root,
            type="string",
            minLength=1,
            title="Storage root",
            description="Absolute local path or gs://bucket/prefix.",
        ),
        "submission_name": Param(
            None,
            type=["null", "string"],
            pattern=NAME_PATTERN,
            title="Submission name",
            description="Folder under the storage root; empty: derived from the DAG run id.",
        ),
        "system": Param(
            {},
            type="object",
            properties={name: {"type": "string"} for name in _system_fields()},
            additionalProperties=False,
            title="System description",
            description=(
                "Fields of systems/<system_name>.json to set; the rest describe this machine "
                "(local backend). The gke backend needs at least system_name and the "
                "accelerator fields."
            ),
        ),
    }


def _name_from_run_id(run_id: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", run_id).strip("._-")
    return name or "submission"


def submission_spec(
    params: Mapping[str, Any], *, run_id: str, deployment: Deployment
) -> SubmissionSpec:
    """Validate the Params across fields; raises ParamError naming the Param."""
    seeds = params["seeds"]
    if not isinstance(seeds, list) or not all(
        isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds
    ):
        raise ParamError(f"seeds: must be a list of integers >= 0, got {seeds!r}")
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise ParamError(f"seeds: seed(s) {repeated} repeated; every run needs its own seed")
    if len(seeds) != RUNS_PER_SUBMISSION:
        raise ParamError(
            f"seeds: a {recipe.BENCHMARK} submission has {RUNS_PER_SUBMISSION} runs (the "
            f"package checker's count), got {len(seeds)}"
        )
    target = params["target"]
    if isinstance(target, bool) or not isinstance(target, int | float):
        raise ParamError(f"target: must be a number, got {target!r}")
    if abs(target - recipe.TARGET_ACCURACY) > 1e-12:
        raise ParamError(
            f"target: MLPerf {recipe.RULESET} fixes the {recipe.BENCHMARK} target at "
            f"eval_accuracy > {recipe.TARGET_ACCURACY} (both divisions); the checkers would "
            f"reject a submission judged against {target}"
        )
    backend = params["backend"]
    if backend != deployment.backend:
        raise ParamError(
            f"backend: this Airflow deployment runs jobs on {deployment.backend!r} (from "
            f"{deployment.source}); {backend!r} needs a deployment configured for it"
        )
    name = params["submission_name"]
    if name is None:
        name = _name_from_run_id(run_id)
    elif not isinstance(name, str) or not re.match(NAME_PATTERN, name):
        raise ParamError(f"submission_name: {name!r} must match {NAME_PATTERN}")
    system = params["system"]
    if not isinstance(system, dict) or not all(isinstance(v, str) for v in system.values()):
        raise ParamError(f"system: must be an object of strings, got {system!r}")
    unknown = sorted(set(system) - set(_system_fields()))
    if unknown:
        raise ParamError(f"system: unknown field(s) {', '.join(unknown)}")
    if backend == "gke" and "system_name" not in system:
        raise ParamError(
            "system: on gke the defaults would describe the Airflow worker, not the TPU "
            "system; set at least system_name and the accelerator fields"
        )
    spec = SubmissionSpec(
        name=name,
        out_dir=join(check_path("storage_root", params["storage_root"]), name),
        seeds=tuple(seeds),
        global_batch_size=params["global_batch_size"],
        max_steps=params["max_steps"],
        val_start_at=params["val_start_at"],
        target=float(target),
        division=params["division"],
        backend=backend,
        system=dict(system),
    )
    from tasks.run_spec import run_spec

    for seed in spec.seeds:
        run_spec(spec.run_spec(seed).to_dict())  # the per-run checks, before any run starts
    system_description(spec)  # field values the package checker would refuse
    return spec


def system_description(spec: SubmissionSpec):
    from rcpflow.package import SystemDescription, local_system

    try:
        if spec.backend == "local":
            return local_system(**spec.system, division=spec.division)
        return SystemDescription(**spec.system, division=spec.division)
    except ValueError as exc:
        raise ParamError(f"system: {exc}") from exc


def _code_dirs() -> list[str]:
    """The implementation's source trees to ship in benchmarks/<bm>/implementations/."""
    import importlib.util

    found = []
    for package in ("tpu_jobs", "rcpflow"):
        spec = importlib.util.find_spec(package)  # finds without importing (tpu_jobs needs jax)
        if spec is not None and spec.submodule_search_locations:
            found.append(list(spec.submodule_search_locations)[0])
    return found


# ---- tasks -------------------------------------------------------------------------------------


def plan_submission_task(deployment: Deployment):
    @task(task_id="plan")
    def plan() -> dict[str, Any]:
        context = get_current_context()
        spec = submission_spec(context["params"], run_id=context["run_id"], deployment=deployment)
        log.info("submission %s in %s: seeds %s", spec.name, spec.out_dir, list(spec.seeds))
        return spec.to_dict()

    return plan


def seed_runs(triggers: XComArg, *, poke_interval: int = 10):
    """One mlperf_grpo_run per seed, waited for without holding a worker slot (deferred)."""
    from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator

    return TriggerDagRunOperator.partial(
        task_id="run_seed",
        trigger_dag_id=RUN_DAG_ID,
        wait_for_completion=True,
        deferrable=True,
        poke_interval=poke_interval,
        reset_dag_run=True,
        allowed_states=["success"],
        failed_states=["failed"],
        map_index_template="seed {{ task.conf['seed'] }}",
    ).expand_kwargs(triggers)


@task
def seed_triggers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return SubmissionSpec.from_dict(spec).triggers()


@task
def package(spec: dict[str, Any]) -> str:
    from rcpflow.package import package_submission

    sub = SubmissionSpec.from_dict(spec)
    org = package_submission(
        [sub.run_dir(s) for s in sub.seeds],
        list(sub.seeds),
        sub.out_dir,
        system_description(sub),
        division=sub.division,
        code_dirs=_code_dirs(),
    )
    log.info("submission folder: %s", org)
    return org


class CheckFailed(RuntimeError):
    """An official checker reported errors; the message lists them."""


def _run_check(tool: str, spec: dict[str, Any], org: str) -> dict[str, Any]:
    from rcpflow import checkers
    from tasks.verdicts import record, tool_log_dir

    sub = SubmissionSpec.from_dict(spec)
    log_dir = tool_log_dir(sub.out_dir)
    if tool == "rcp_checker":
        subject = join(org, "results", system_description(sub).system_name, recipe.BENCHMARK)
        result = checkers.rcp(subject, log_dir=log_dir)
    elif tool == "package_checker":
        subject, result = org, checkers.package(org, log_dir=log_dir)
    else:
        subject, result = org, checkers.result_summary(org, log_dir=log_dir)
    verdict = record(result, subject=subject, folder=sub.out_dir)
    for line in result.output.splitlines()[-30:]:
        log.info("%s | %s", tool, line)
    if not verdict.ok:
        raise CheckFailed(f"{tool} on {subject}:\n  " + "\n  ".join(verdict.errors or ("?",)))
    log.info("%s", verdict.headline())
    return {"tool": tool, "ok": True, "score_minutes": verdict.score_minutes}


@task
def rcp_check(spec: dict[str, Any], org: str) -> dict[str, Any]:
    return _run_check("rcp_checker", spec, org)


@task
def package_check(spec: dict[str, Any], org: str) -> dict[str, Any]:
    return _run_check("package_checker", spec, org)


@task
def result_summary(spec: dict[str, Any], org: str) -> dict[str, Any]:
    return _run_check("result_summarizer", spec, org)


# After any outcome of the runs and checks, but not when `plan` refused the Params: then
# there is no submission to report on (its one success is `plan`'s).
@task(trigger_rule=TriggerRule.ALL_DONE_MIN_ONE_SUCCESS)
def report(spec: dict[str, Any]) -> str:
    from tasks.report import write_report

    path, passed = write_report(SubmissionSpec.from_dict(spec))
    if not passed:
        raise CheckFailed(f"the submission did not pass every check; see {path}")
    return path


def submission_tasks(deployment: Deployment, *, poke_interval: int = 10) -> None:
    """Wire the submission's tasks into the DAG being defined."""
    spec = plan_submission_task(deployment)()
    runs = seed_runs(seed_triggers(spec), poke_interval=poke_interval)
    org = package(spec)
    checks = [rcp_check(spec, org), package_check(spec, org), result_summary(spec, org)]
    runs >> org
    checks >> report(spec)
