"""`rcpflow manifest import RUN_DIR --format nemo-rl CHECKPOINT_ROOT`: the manifest from NeMo-RL's
checkpoint tree (`rcpflow.records.nemo_rl`).

One row per ``step_<N>/`` from the validation start: checkpoint ``CHECKPOINT_ROOT/step_<N>``,
timestamp ``training_step_end_time_ms``, samples_count N x the MLLOG's ``global_batch_size``.
Every checkpoint is verified first (`read_checkpoint`, `check_order`), the steps must be
contiguous, the run folder's MLLOG training section must be one the checker accepts (a missing
``block_stop`` aside: training may still run), and rows already in the manifest must be the
same; anything else is one line naming the step, file and field, and nothing is written. A
second import of the same tree writes nothing (the same bytes); new checkpoints append rows, so
it can run while training runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from rcpflow import recipe
from rcpflow.files.layout import RunLayout
from rcpflow.files.storage import storage_for
from rcpflow.files.usererrors import refused_as
from rcpflow.records import manifest
from rcpflow.records.manifest import ManifestError, ManifestRow
from rcpflow.records.mllog import MLLogError, read_events
from rcpflow.records.nemo_rl import (
    CheckpointTree,
    NemoRLError,
    check_order,
    keep_top_k,
    list_tree,
    read_checkpoint,
    step_dir,
    training_block_stop,
)
from rcpflow.records.training_section import describe as describe_section
from rcpflow.records.training_section import section_problems
from rcpflow.trainer.manifest_add import as_given, find_mllog, header_int, seed_index
from rcpflow.trainer.recorder import RecorderError, build_row
from rcpflow.verdict.schedule import EvalSchedule

FORMATS = ("nemo-rl",)


@dataclass(frozen=True)
class CheckpointTreeImport:
    root: str
    added: tuple[int, ...]
    rows: int  # rows in the manifest after the import
    ignored: tuple[str, ...]  # tmp_step_*/old_step_* and steps before the validation start

    def describe(self) -> str:
        what = (
            f"steps {self.added[0]}..{self.added[-1]} added"
            if self.added
            else "nothing new (the manifest has every checkpoint)"
        )
        text = f"{self.root}: {what}; {self.rows} rows"
        return text + (f"; ignored: {', '.join(self.ignored)}" if self.ignored else "")


def _no_checkpoint_yet(root: str) -> bool:
    """Whether the tree at `root` holds no ``step_<N>`` checkpoint (or is not there yet)."""
    try:
        return not list_tree(as_given(root)).steps
    except FileNotFoundError:
        return True


def import_checkpoint_tree(
    run_dir: str,
    root: str,
    *,
    seed: int | None = None,
    val_start_at: int | None = None,
    allow_empty: bool = False,
    eval_schedule: EvalSchedule | None = None,
) -> CheckpointTreeImport:
    """Verify NeMo-RL's tree at `root` and append its new checkpoints to `run_dir`'s manifest.
    `val_start_at`: default the manifest's, else the recipe's. `allow_empty`: a tree without a
    checkpoint yet is no error (a poll while training runs, or before the trainer has written
    its MLLOG). `eval_schedule` ``after_training``:
    a tree whose config's keep_top_k would delete a checkpoint before its evaluation is refused
    (`check_keeps_all`). Raises `NemoRLError`."""
    layout = RunLayout(run_dir)
    try:
        log_path = layout.mllog(seed) if seed is not None else find_mllog(run_dir)
        events = read_events(log_path)
    except RecorderError as e:
        raise NemoRLError(str(e)) from e
    except FileNotFoundError as e:
        if allow_empty and _no_checkpoint_yet(root):  # a poll before the trainer started
            return CheckpointTreeImport(root, (), 0, ())
        raise NemoRLError(f"{layout.mllog(seed or 0)}: no MLLOG (MLPERF_MLLOG_FILE)") from e
    except MLLogError as e:
        raise NemoRLError(str(e)) from e
    starts = [e for e in events if e.key == "run_start"]
    if not starts:
        if allow_empty and _no_checkpoint_yet(root):
            return CheckpointTreeImport(root, (), 0, ())
        raise NemoRLError(f"{log_path}: no run_start: training has not started")
    with refused_as(NemoRLError, RecorderError):
        header = {
            k: header_int(events, k, log_path)
            for k in (
                "seed",
                "global_batch_size",
                "num_prompts_per_step",
                "num_generations_per_prompt",
                "max_steps",
            )
        }
        index = seed_index(log_path)  # the row names the MLLOG read, whatever seed it states
    gbs, prompts = header["global_batch_size"], header["num_prompts_per_step"]
    if prompts * header["num_generations_per_prompt"] != gbs:
        raise NemoRLError(
            f"{log_path}: num_prompts_per_step {prompts} x num_generations_per_prompt "
            f"{header['num_generations_per_prompt']} != global_batch_size {gbs}"
        )
    with refused_as(NemoRLError, ManifestError):
        existing = manifest.read_rows(layout.manifest)
    run_start = starts[-1].time_ms
    current = sorted((r for r in existing if r.timestamp_ms >= run_start), key=lambda r: r.step)
    start = current[0].val_start_at if current else val_start_at
    if start is None:
        start = recipe.val_start_at(gbs)
    if val_start_at is not None and val_start_at != start:
        raise NemoRLError(f"val_start_at {val_start_at} differs from the manifest's {start}")

    tree = list_tree(as_given(root))  # a relative root is the caller's: made absolute
    steps = [s for s in tree.steps if s >= start]
    ignored = [*tree.partial, *tree.skipped, *(f"step_{s} (before the validation start {start})"
                                               for s in tree.steps if s < start)]  # fmt: skip
    if not steps:
        if allow_empty:
            return CheckpointTreeImport(tree.root, (), len(current), tuple(ignored))
        only = f" (only {', '.join(tree.partial)}: saves not yet renamed)" if tree.partial else ""
        raise NemoRLError(
            f"{tree.root}: no step_<N>/ checkpoint from the validation start {start}{only}"
        )
    _check_none_lost(layout, current, tree, header["max_steps"])
    if eval_schedule == "after_training":
        check_keeps_all(tree.root, steps[0], start, header["max_steps"])
    checkpoints = [read_checkpoint(tree.root, s, prompts) for s in steps]
    check_order(checkpoints, run_start, training_block_stop(events, starts[-1].line_no), tree.root)
    by_step = {r.step: r for r in current}
    rows: list[ManifestRow] = []
    for c in checkpoints:
        try:
            row = build_row(
                layout.root, c.step, step_dir(tree.root, c.step), c.timestamp_ms,
                seed=index, global_batch_size=gbs,
                num_generations=header["num_generations_per_prompt"], val_start_at=start,
                max_steps=header["max_steps"], target_accuracy=recipe.TARGET_ACCURACY, extra={},
            )  # fmt: skip
        except RecorderError as e:
            raise NemoRLError(f"{e} ({c.path})") from e
        old = by_step.get(c.step)
        if old is not None and old != row:
            raise NemoRLError(
                f"step {c.step}: {c.path} is not the manifest's row ({old.checkpoint_path} at "
                f"{old.timestamp_ms}): another run's tree?"
            )
        rows.append(row)
    want = (current[-1].step + 1) if current else start
    new = [r for r in rows if r.step not in by_step]
    for r in new:
        if r.step != want:
            why = [s for s in tree.skipped if s.startswith(f"step_{want} ")]
            raise NemoRLError(
                f"step {want}: no {step_dir(tree.root, want)}/ (steps must be contiguous from "
                f"the validation start {start}; the tree has step_{r.step} next)"
                + (
                    f"; skipped: {why[0]}"
                    if why
                    else f"; {keep_top_k_hint(header['max_steps'], start)}"
                )
            )
        want += 1
    merged = sorted([*current, *new], key=lambda r: r.step)
    with refused_as(NemoRLError, ManifestError):
        manifest.check_consistent(merged, layout.manifest)
    problems = [p for p in section_problems(events, merged) if not p.resumable]
    if problems:
        raise NemoRLError(f"{log_path}: {describe_section(problems)}")
    if new:
        _append(layout.manifest, new)
    return CheckpointTreeImport(tree.root, tuple(r.step for r in new), len(merged), tuple(ignored))


def keep_top_k_hint(max_steps: int, val_start_at: int) -> str:
    """What to change in NeMo-RL when its own pruning deleted a checkpoint: its deferred
    configuration keeps ``max(checkpointing.keep_top_k, 2)`` checkpoints."""
    return (
        "deleted by NeMo-RL's checkpointing.keep_top_k? set it to at least "
        f"{max_steps - val_start_at + 1} (every checkpoint from step {val_start_at} to "
        f"{max_steps}) so that none is deleted before its evaluation"
    )


def check_keeps_all(root: str, step: int, val_start_at: int, max_steps: int) -> None:
    """Evaluation after training needs every checkpoint from the validation start to be there
    when training ends; NeMo-RL keeps ``max(checkpointing.keep_top_k, 2)`` (its deferred
    configuration), every one with null. Refused naming the setting when it keeps fewer; a
    config that cannot be read says nothing (the incremental import still names a loss)."""
    found, k = keep_top_k(root, step)
    needed = max_steps - val_start_at + 1
    if found and k is not None and max(k, 2) < needed:
        raise NemoRLError(
            f"step {step}: {step_dir(root, step)}/config.yaml: checkpointing.keep_top_k {k} keeps "
            f"{max(k, 2)} checkpoints, and evaluation after training needs all {needed} (steps "
            f"{val_start_at}..{max_steps}): NeMo-RL would delete them before their evaluation; "
            f"set it to at least {needed} (or null), or evaluate during training"
        )


def _check_none_lost(
    layout: RunLayout, rows: list[ManifestRow], tree: CheckpointTree, max_steps: int
) -> None:
    """A manifest row whose ``step_<N>/`` left the tree before its evaluation (no summary yet)
    is named: NeMo-RL prunes older checkpoints while training (keep_top_k), and a checkpoint
    rcpflow still has to evaluate cannot come back."""
    present = set(tree.steps)
    lost = [
        r.step
        for r in rows
        if r.step not in present
        and not storage_for(layout.summary(r.step)).exists(layout.summary(r.step))
    ]
    if lost:
        more = (
            f" (and {len(lost) - 1} more: {', '.join(map(str, lost[1:]))})" if len(lost) > 1 else ""
        )
        raise NemoRLError(
            f"step {lost[0]}: {step_dir(tree.root, lost[0])}/ is gone before its evaluation{more}; "
            + keep_top_k_hint(max_steps, rows[0].val_start_at)
        )


def _append(path: str, new: list[ManifestRow]) -> None:
    """Write `new` rows under the manifest's lock. Another import of the same tree may have
    written some of them meanwhile (the run DAG imports from more than one place): the same
    rows are no conflict, a different row for a step is."""

    def merge(old: bytes | None) -> bytes:
        now = manifest.parse_rows(manifest.decode(old, path), path) if old else []
        have = {r.step: r for r in now}
        add = []
        for r in new:
            if r.step not in have:
                add.append(r)
            elif have[r.step] != r:
                raise NemoRLError(
                    f"step {r.step}: written meanwhile as {have[r.step].checkpoint_path} at "
                    f"{have[r.step].timestamp_ms}; run it again"
                )
        if not add and old is not None:
            return old
        with refused_as(NemoRLError, ManifestError):
            manifest.check_consistent([*now, *add], path)
        return manifest.render_rows([*now, *add])

    storage_for(path).update(path, merge)
