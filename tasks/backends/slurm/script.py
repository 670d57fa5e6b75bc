"""A job's argv and env rendered into a Slurm batch script.

Every value is quoted (`shlex.quote`), so each argv item stays one argument and nothing of a
Param is expanded by the shell; env values are exported; a ``secret_env`` variable is read on
the cluster when the job starts (a file or a variable there), so its value is never in the
script. Every task is started by ``srun``; with more than one task each learns its place in
the `jax.distributed` system from Slurm (``RCPFLOW_PROCESS_ID`` = ``SLURM_PROCID``, process 0
on the batch host). The batch shell passes a SIGTERM (``--signal=B:TERM@<grace>``, or a
preemption) on to the tasks (through Slurm: srun itself would kill them) and exits with their
code. The job's environment is only what the script sets: ``--export`` is ``NIL`` (Slurm's
own variables) or the deployment's `export_env` names, never the submitting process's
environment (Airflow's secrets are in it); the job carries rcpflow's comment (`job_comment`)
and writes its output where `output_file` says. docs/slurm.md has the why.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from rcpflow.trainer.job_exit import EXIT_INVALID_INPUT
from tasks.backends.slurm.settings import SecretRef, SlurmJobShape
from tasks.jobs.templates import ENV_NAME  # the project's one rule for a variable name

# The multi-process layout the toy jobs read (tpu_jobs/rcp/distributed.py).
COORDINATOR_ADDRESS_ENV = "RCPFLOW_COORDINATOR_ADDRESS"
NUM_PROCESSES_ENV = "RCPFLOW_NUM_PROCESSES"
PROCESS_ID_ENV = "RCPFLOW_PROCESS_ID"
_JOB_NAME = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_.]{0,127}$")
_NO_WHITESPACE = re.compile(r"^[^\s'\"\\]+$")


def output_file(log_dir: str, name: str, job_id: str = "%j") -> str:
    """The output file (stdout and stderr) of the job `name` with id `job_id` (``%j``: for
    sbatch to fill in): the one home of that path, read back from it, never from Slurm."""
    return f"{log_dir.rstrip('/')}/{name}-{job_id}.out"


def job_comment(name: str) -> str:
    """The comment rcpflow submits the job `name` with: with the submitting account, what
    tells rcpflow's job from one of the same name someone else (or a hand) submitted."""
    return f"rcpflow:{name}"


class ScriptError(ValueError):
    """A job cannot be rendered as asked; the message names what."""


def _no_env() -> Mapping[str, str]:
    return MappingProxyType({})


def _no_secrets() -> Mapping[str, SecretRef]:
    return MappingProxyType({})


# The per-step placeholders an evaluation in the training's allocation can fill in the script
# (the others need the step's manifest row, which the script does not read).
IN_ALLOCATION_STEP_FIELDS = ("step", "summary_dir")


@dataclass(frozen=True)
class InAllocationEval:
    """Evaluate the run's checkpoints after the training, in its allocation (the reference's
    schedule): steps `first`..`last` in order, each with `argv` (``{step}`` and
    ``{summary_dir}`` left in it, everything else filled) on `nodes` x `ntasks_per_node` of
    the allocation's nodes, until one passes or has no row (``rcpflow status``, run with
    `python`, decides). A `result_format` other than "" is a foreign result at `result_path`
    (``{step}``/``{summary_dir}`` left in it): each step's is imported into rcpflow's summary
    right after its evaluation, by the evaluate step's own rule (``rcpflow eval start`` before
    it, ``rcpflow eval import --since`` after: only what it left, with this clock); one that
    fails to import leaves its step to the DAG's evaluate task."""

    argv: tuple[str, ...]
    python: str
    run_dir: str
    first: int
    last: int
    nodes: int = 1
    ntasks_per_node: int = 1
    env: Mapping[str, str] = field(default_factory=_no_env)  # the evaluate job's own
    result_format: str = ""
    result_path: str = ""

    def __post_init__(self) -> None:
        if bool(self.result_format) != bool(self.result_path):
            raise ScriptError("in-allocation evaluation: a result needs its format and its path")
        for name in self.env:
            if not ENV_NAME.fullmatch(name):
                raise ScriptError(f"{name!r} is not an environment variable name")
        if not self.argv or self.first > self.last or self.first < 1:
            raise ScriptError(f"in-allocation evaluation: steps {self.first}..{self.last}")


@dataclass(frozen=True)
class BatchJob:
    """What one sbatch submission runs: `argv` with `env` (values) and `secret_env`
    (references), as `name`, in `shape`'s allocation, from `working_dir`, its output in
    `log_dir`."""

    name: str
    argv: tuple[str, ...]
    shape: SlurmJobShape
    working_dir: str
    log_dir: str
    env: Mapping[str, str] = field(default_factory=_no_env)
    secret_env: Mapping[str, SecretRef] = field(default_factory=_no_secrets)
    then_evaluate: InAllocationEval | None = None
    export_env: tuple[str, ...] = ()  # the deployment's names passed on from sbatch's env

    def __post_init__(self) -> None:
        if self.then_evaluate is not None and self.then_evaluate.nodes > self.shape.nodes:
            raise ScriptError(
                f"in-allocation evaluation on {self.then_evaluate.nodes} nodes, the allocation "
                f"has {self.shape.nodes}"
            )
        if not _JOB_NAME.fullmatch(self.name):
            raise ScriptError(f"job name {self.name!r}: letters, digits, '-', '_', '.'")
        if not self.argv:
            raise ScriptError("argv is empty")
        for path in (self.working_dir, self.log_dir):
            if not path.startswith("/") or not _NO_WHITESPACE.fullmatch(path):
                raise ScriptError(f"{path!r}: an absolute path without whitespace or quotes")
        for name in (*self.env, *self.secret_env, *self.export_env):
            if not ENV_NAME.fullmatch(name):
                raise ScriptError(f"{name!r} is not an environment variable name")
        both = sorted(set(self.env) & set(self.secret_env))
        if both:
            raise ScriptError(f"{', '.join(both)}: both a value and a secret reference")

    @property
    def output_path(self) -> str:
        """The job's output file (stdout and stderr), ``%j`` the job id."""
        return output_file(self.log_dir, self.name)


def sbatch_options(job: BatchJob) -> list[str]:
    """The job's sbatch options, each one ``--name=value`` (or ``--flag``) argument."""
    shape = job.shape
    options = [
        f"--job-name={job.name}",
        f"--comment={job_comment(job.name)}",
        # Only Slurm's own variables (NIL: not even the login shell's) or the names the
        # deployment lists: never the submitting worker's environment (Airflow's secrets).
        f"--export={','.join(job.export_env) or 'NIL'}",
        f"--output={job.output_path}",
        f"--error={job.output_path}",
        "--open-mode=append",  # a requeued job's output goes on in the same file
        f"--chdir={job.working_dir}",
        f"--nodes={shape.nodes}",
        f"--ntasks-per-node={shape.ntasks_per_node}",
        f"--cpus-per-task={shape.cpus_per_task}",
        f"--time={shape.time_limit}",
        f"--signal=B:TERM@{shape.signal_grace_s}",
        # Slurm requeues on its own only what is not the job's fault (node failure,
        # preemption); a failure of the job itself is rcpflow's to restart.
        "--requeue",
    ]
    options += [f"--{flag}={value}" for flag, value in shape.named_options()]
    if shape.mem:
        options.append(f"--mem={shape.mem}")
    if shape.gpus_per_node:
        options.append(f"--gpus-per-node={shape.gpus_per_node}")
    if shape.exclusive:
        options.append("--exclusive")
    for arg in shape.extra_sbatch_args:
        if not _NO_WHITESPACE.fullmatch(arg):
            raise ScriptError(f"extra sbatch argument {arg!r}: one argument without whitespace")
        options.append(arg)
    return options


def _secret_lines(name: str, ref: SecretRef) -> list[str]:
    """Shell lines that set and export `name` from its reference, or stop the job (exit 5)
    naming the reference (never a value)."""
    if ref.file:
        where = f"the file {ref.file}"
        read = f'{name}="$(cat -- {shlex.quote(ref.file)})"'
        return [
            f"if ! {read}; then",
            f"  echo {shlex.quote(f'rcpflow: {name}: cannot read {where}')} >&2",
            f"  exit {EXIT_INVALID_INPUT}",
            "fi",
            f"export {name}",
        ]
    return [
        f'if [ -z "${{{ref.env}+set}}" ]; then',
        f"  echo {shlex.quote(f'rcpflow: {name}: the variable {ref.env} is not set')} >&2",
        f"  exit {EXIT_INVALID_INPUT}",
        "fi",
        f'export {name}="${{{ref.env}}}"',
    ]


def srun_command(job: BatchJob) -> list[str]:
    """The srun line's words (each already quoted for the shell)."""
    shape = job.shape
    words = ["srun", "--kill-on-bad-exit=1", f"--ntasks={shape.tasks}"]
    if shape.container_image:
        words.append(shlex.quote(f"--container-image={shape.container_image}"))
        if shape.container_mounts:
            mounts = ",".join(shape.container_mounts)
            words.append(shlex.quote(f"--container-mounts={mounts}"))
        words.append(shlex.quote(f"--container-workdir={job.working_dir}"))
    if shape.tasks > 1:
        # Each task's own id, set inside the task: the argv goes on as "$@", unexpanded.
        words += [
            "bash",
            "-c",
            shlex.quote(f'export {PROCESS_ID_ENV}="$SLURM_PROCID"; exec "$@"'),
            "rcpflow-task",
        ]
    words += [shlex.quote(item) for item in job.argv]
    return words


def _step_word(item: str) -> str:
    """`item` as one shell word in which ``{step}`` and ``{summary_dir}`` are the loop's
    variables and everything else is quoted."""
    import string

    parts = []
    for literal, name, _spec, _conv in string.Formatter().parse(item):
        if literal:
            parts.append(shlex.quote(literal))
        if name == "step":
            parts.append('"$rcpflow_step"')
        elif name == "summary_dir":
            parts.append('"$rcpflow_summary_dir"')
        elif name is not None:
            raise ScriptError(f"{item!r}: {{{name}}} cannot be filled in the allocation")
    return "".join(parts) or "''"


# Reads `rcpflow status --json` on stdin: the gate of the step given (or "none": no row).
_GATE = (
    "import json,sys; s=json.load(sys.stdin); "
    'print(next((x["gate"] for x in s.get("steps", []) if x["step"] == int(sys.argv[1])), '
    '"none"))'
)


def _in_allocation_lines(job: BatchJob, then: InAllocationEval) -> list[str]:
    py, run_dir = shlex.quote(then.python), shlex.quote(then.run_dir)
    tasks = then.nodes * then.ntasks_per_node
    srun = [
        "srun",
        "--kill-on-bad-exit=1",
        f"--nodes={then.nodes}",
        f"--ntasks={tasks}",
        f"--ntasks-per-node={then.ntasks_per_node}",
    ]
    if tasks > 1:
        srun += ["bash", "-c", shlex.quote(f'export {PROCESS_ID_ENV}="$SLURM_PROCID"; exec "$@"'),
                 "rcpflow-task"]  # fmt: skip
    srun += [_step_word(item) for item in then.argv]
    if tasks > 1:  # its own jax.distributed system, beside the training's port
        layout = [
            f'  export {COORDINATOR_ADDRESS_ENV}="${{rcpflow_addr:-$(hostname)}}:'
            '$((20000 + (SLURM_JOB_ID + 1) % 20000))"',
            f"  export {NUM_PROCESSES_ENV}={tasks}",
        ]
    else:  # one process: no layout (the training's would be half a layout)
        layout = [f"  unset {COORDINATOR_ADDRESS_ENV} {NUM_PROCESSES_ENV} {PROCESS_ID_ENV}"]
    if tasks > 1 and job.shape.tasks == 1:
        layout.insert(
            0,
            '  rcpflow_addr="$(scontrol show node "$SLURMD_NODENAME" -o '
            "| sed -n 's/.* NodeAddr=\\([^ ]*\\).*/\\1/p')\"",
        )
    exports = [f"  export {k}={shlex.quote(v)}" for k, v in sorted(then.env.items())]
    rcpflow = f"{py} -m rcpflow eval"
    if then.result_format:
        result = f'{_step_word(then.result_path)} --step "$rcpflow_step" ' + shlex.quote(
            f"--format={then.result_format}"
        )
        start = [
            f'    if ! rcpflow_started="$({rcpflow} start {run_dir} {result})"; then',
            '      echo "rcpflow: step ${rcpflow_step}: its start cannot be recorded: left to '
            "the DAG's evaluate task\"",
            "      continue",
            "    fi",
        ]
        imported = [
            f'    elif ! {rcpflow} import {run_dir} {result} --since "$rcpflow_started"; then',
            '      echo "rcpflow: step ${rcpflow_step}: its result does not import: left to the '
            "DAG's evaluate task\"",
        ]
    else:
        start, imported = [], []
    return [
        'if [ "$rcpflow_rc" -eq 0 ]; then',
        '  echo "rcpflow: evaluating the checkpoints in this allocation"',
        *layout,
        *exports,
        f"  for rcpflow_step in $(seq {then.first} {then.last}); do",
        f'    rcpflow_summary_dir={run_dir}/eval/step_"$rcpflow_step"',
        f'    rcpflow_gate="$({py} -m rcpflow status {run_dir} --json 2>/dev/null '
        f'| {py} -c {shlex.quote(_GATE)} "$rcpflow_step")"',
        '    echo "rcpflow: step ${rcpflow_step}: ${rcpflow_gate}"',
        '    case "$rcpflow_gate" in',
        "      evaluate) ;;",
        '      "below target") continue ;;',
        "      *) break ;;  # it passes, a lower step passed, or no checkpoint of it",
        "    esac",
        *start,
        "    " + " ".join(srun) + " &",
        "    rcpflow_child=$!",
        '    wait "$rcpflow_child"',
        "    rcpflow_eval_rc=$?",
        '    while kill -0 "$rcpflow_child" 2>/dev/null; do',
        '      wait "$rcpflow_child"',
        "      rcpflow_eval_rc=$?",
        "    done",
        '    if [ "$rcpflow_eval_rc" -ne 0 ]; then',
        '      echo "rcpflow: step ${rcpflow_step}: the evaluation ended with exit code '
        "${rcpflow_eval_rc}: left to the DAG's evaluate task\"",
        *imported,
        "    fi",
        "  done",
        "fi",
    ]


def render_script(job: BatchJob) -> str:
    """The batch script of `job` (its options as ``#SBATCH`` lines)."""
    lines = ["#!/bin/bash"]
    lines += [f"#SBATCH {option}" for option in sbatch_options(job)]
    lines += [
        "set -u",
        # sbatch's --export is also srun's default (SLURM_EXPORT_ENV): the steps get the
        # batch shell's environment, which holds only what this script sets.
        "export SLURM_EXPORT_ENV=ALL",
        # With --export=NIL the batch shell may have no PATH (24.11 loads no login environment),
        # and srun finds a step's program through it: the system's default then.
        'export PATH="${PATH:-/usr/local/bin:/usr/bin:/bin}"',
        'echo "rcpflow: Slurm job ${SLURM_JOB_ID} restart ${SLURM_RESTART_COUNT:-0} on '
        '${SLURM_JOB_NODELIST} at $(date -u +%FT%TZ)"',
        "export PYTHONUNBUFFERED=1",
    ]
    for name, value in sorted(job.env.items()):
        lines.append(f"export {name}={shlex.quote(value)}")
    for name, ref in sorted(job.secret_env.items()):
        lines += _secret_lines(name, ref)
    if job.shape.tasks > 1:
        lines += [
            # Process 0 runs on the batch host (srun's block distribution): its address as
            # slurm.conf names it (NodeAddr), a port from the job id.
            'rcpflow_addr="$(scontrol show node "$SLURMD_NODENAME" -o '
            "| sed -n 's/.* NodeAddr=\\([^ ]*\\).*/\\1/p')\"",
            f'export {COORDINATOR_ADDRESS_ENV}="${{rcpflow_addr:-$(hostname)}}:'
            '$((20000 + SLURM_JOB_ID % 20000))"',
            f'export {NUM_PROCESSES_ENV}="$SLURM_NTASKS"',
        ]
    lines += [
        # The tasks run in the background so that the batch shell can pass a SIGTERM on
        # (bash runs a trap only between commands); its exit code is theirs.
        " ".join(srun_command(job)) + " &",
        "rcpflow_child=$!",
        # srun would answer a SIGTERM by killing the step: the tasks get it from Slurm instead
        # (scancel without --batch signals the job's steps only).
        'trap \'echo "rcpflow: SIGTERM, passed on to the tasks"; '
        'scancel --signal=TERM "$SLURM_JOB_ID" || kill -TERM "$rcpflow_child"\' TERM',
        'wait "$rcpflow_child"',
        "rcpflow_rc=$?",
        'while kill -0 "$rcpflow_child" 2>/dev/null; do wait "$rcpflow_child"; rcpflow_rc=$?; done',
        'echo "rcpflow: tasks ended with exit code ${rcpflow_rc} at $(date -u +%FT%TZ)"',
    ]
    if job.then_evaluate is not None:
        # An evaluation that fails leaves its step to the DAG's own evaluation job.
        lines += _in_allocation_lines(job, job.then_evaluate)
    lines.append('exit "$rcpflow_rc"')
    return "\n".join(lines) + "\n"
