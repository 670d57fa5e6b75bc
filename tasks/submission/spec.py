"""What a submission is asked to do: the Params of ``mlperf_grpo_submission``, their checks and
the `SubmissionSpec` the ``plan`` task hands to the rest.

Two Params are declarations, not knobs: ``target`` must be the rules' 0.69 (refused otherwise,
before compute is spent) and ``backend`` must be this deployment's (recorded in the report).
A submission lives under ``<storage_root>/<submission_name>/``: ``runs/seed_<s>/``,
``submission/`` (the package), ``checks/`` (verdicts), ``report.md``.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow.sdk import Param, get_current_context, task

from rcpflow import recipe
from rcpflow.files.layout import join
from rcpflow.recipe import Division
from rcpflow.submission.package import SystemDescription, local_system
from rcpflow.verdict.schedule import DEFAULT_SCHEDULE, closed_division_warning
from tasks.backends.registry import driver_type, form_defaults, registered
from tasks.deployment import BackendName, Deployment, EvalSchedule, load_deployment
from tasks.run.spec import (
    ParamError,
    RunSpec,
    XComValue,
    check_path,
    check_under_root,
    run_spec,
    training_params,
)

log = logging.getLogger(__name__)

# The package checker's count of result files for this benchmark.
RUNS_PER_SUBMISSION = 3
DEFAULT_SEEDS = (1, 2, 3)
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


@dataclass(frozen=True)
class SubmissionSpec:
    name: str
    out_dir: str
    seeds: tuple[int, ...]
    global_batch_size: int
    max_steps: int
    val_start_at: int | None
    target: float
    division: Division
    backend: BackendName
    system: Mapping[str, str]  # overrides of rcpflow.submission.package's system description
    eval_schedule: EvalSchedule = DEFAULT_SCHEDULE
    eval_window: int = 1

    def run_dir(self, seed: int) -> str:
        return join(self.out_dir, "runs", f"seed_{seed}")

    def run_spec(self, seed: int) -> RunSpec:
        """`seed`'s run, built and checked by the run DAG's own `run_spec` from the fields the
        two share: a seed's conf is one the run DAG accepts. Raises ParamError naming the Param."""
        return run_spec({**self.to_dict(), "run_dir": self.run_dir(seed), "seed": seed})

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
    def from_dict(cls, d: XComValue) -> SubmissionSpec:
        return cls(**{**d, "seeds": tuple(d["seeds"]), "system": dict(d["system"])})


def _system_fields() -> list[str]:
    return [f.name for f in dataclasses.fields(SystemDescription) if f.name != "division"]


def submission_params(deployment: Deployment) -> dict[str, Param]:
    """Params of mlperf_grpo_submission with JSON schema (fresh objects per DAG)."""
    return {
        "seeds": Param(
            list(DEFAULT_SEEDS),
            type="array",
            items={"type": "integer", "minimum": 0, "maximum": recipe.MAX_SEED},
            minItems=RUNS_PER_SUBMISSION,
            maxItems=RUNS_PER_SUBMISSION,
            uniqueItems=True,
            title="Seeds",
            description=f"{RUNS_PER_SUBMISSION} distinct seeds: one run each.",
        ),
        **training_params(form_defaults(deployment)),
        # One allowed value: the form shows it as a choice of one, not an editable number.
        "target": Param(
            recipe.TARGET_ACCURACY,
            type="number",
            enum=[recipe.TARGET_ACCURACY],
            values_display={str(recipe.TARGET_ACCURACY): f"{recipe.TARGET_ACCURACY} (fixed)"},
            title="Quality target (fixed by the rules)",
            description=(
                f"eval_accuracy (pass@4) must exceed this; MLPerf {recipe.RULESET} fixes it at "
                f"{recipe.TARGET_ACCURACY} in both divisions, other values are refused."
            ),
        ),
        "backend": Param(
            deployment.backend,
            type="string",
            enum=sorted(registered()),
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
                "Fields of systems/<system_name>.json to set, as strings; the rest describe "
                "this machine (local backend). The gke backend needs at least system_name and "
                "the accelerator fields. Allowed keys: " + ", ".join(_system_fields()) + "."
            ),
        ),
    }


def name_from_run_id(run_id: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", run_id).strip("._-")
    return name or "submission"


def submission_spec(
    params: Mapping[str, Any], *, run_id: str, backend: BackendName, source: str
) -> SubmissionSpec:
    """Validate the Params across fields; raises ParamError naming the Param."""
    seeds = params["seeds"]
    if not isinstance(seeds, list) or not all(
        isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= recipe.MAX_SEED for s in seeds
    ):
        raise ParamError(
            f"seeds: must be a list of integers in 0..{recipe.MAX_SEED}, got {seeds!r}"
        )
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
    if params["backend"] != backend:
        raise ParamError(
            f"backend: this Airflow deployment runs jobs on {backend!r} (from {source}); "
            f"{params['backend']!r} needs a deployment configured for it"
        )
    name = params["submission_name"]
    if name is None:
        name = name_from_run_id(run_id)
    elif not isinstance(name, str) or not re.fullmatch(NAME_PATTERN, name):
        raise ParamError(f"submission_name: {name!r} must match {NAME_PATTERN}")
    system = params["system"]
    if not isinstance(system, dict) or not all(isinstance(v, str) for v in system.values()):
        raise ParamError(f"system: must be an object of strings, got {system!r}")
    unknown = sorted(set(system) - set(_system_fields()))
    if unknown:
        raise ParamError(f"system: unknown field(s) {', '.join(unknown)}")
    if not driver_type(backend).jobs_run_on_worker and "system_name" not in system:
        raise ParamError(
            f"system: on {backend} the defaults would describe the Airflow worker, not the "
            "accelerator system; set at least system_name and the accelerator fields"
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
        eval_schedule=params["eval_schedule"],
        eval_window=params["eval_window"],
    )
    for seed in spec.seeds:
        spec.run_spec(seed)  # the per-run checks, before any run starts
    system_description(spec)  # field values the package checker would refuse
    return spec


def system_description(spec: SubmissionSpec) -> SystemDescription:
    """The system the runs ran on: this machine's, with the Params' fields set, when the jobs
    run on the worker; otherwise only what the Params say."""
    try:
        if driver_type(spec.backend).jobs_run_on_worker:
            return local_system(**spec.system, division=spec.division)
        return SystemDescription(**spec.system, division=spec.division)
    except ValueError as exc:
        raise ParamError(f"system: {exc}") from exc


@task(task_id="plan")
def plan_submission(backend: BackendName, deployment_source: str) -> dict[str, Any]:
    """First task of a submission: the validated SubmissionSpec (fails naming the Param)."""
    context = get_current_context()
    spec = submission_spec(
        context["params"], run_id=context["run_id"], backend=backend, source=deployment_source
    )
    check_under_root("storage_root", spec.out_dir, load_deployment())
    log.info("submission %s in %s: seeds %s", spec.name, spec.out_dir, list(spec.seeds))
    schedule = spec.run_spec(spec.seeds[0]).schedule_record
    log.info("every run: %s", schedule.statement())
    warning = closed_division_warning(spec.eval_schedule, spec.division)
    if warning is not None:
        log.warning("%s", warning)
    return spec.to_dict()
