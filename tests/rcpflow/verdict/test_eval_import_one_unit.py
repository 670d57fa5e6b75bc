"""One step's evaluation written as one unit: two imports of a step at once, the first paused at
the hook point between its two writes (its attempts written, its summary not yet), leave one
source's summary and attempts together, never one's summary beside the other's attempts."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path

from foreign import nemo_evaluator
from nemo_runs import train_nemo

from rcpflow.files.layout import RunLayout
from rcpflow.records.summary import read_summary
from rcpflow.trainer.nemo_rl_import import import_checkpoint_tree
from rcpflow.verdict import eval_import
from rcpflow.verdict.verify import attempts_file

STEP = 3


def attempt_records(path: Path) -> str:
    """rcpflow's attempt records: 251 tasks x 4 attempts, tasks below 200 solved."""
    lines = [
        json.dumps({"instance": i, "attempt": a, "status": "resolved" if i < 200 else "failed",
                    "reward": 1.0 if i < 200 else 0.0, "prompt": [1], "completion": [2]})
        for i in range(251)
        for a in range(4)
    ]  # fmt: skip
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def test_concurrent_imports_of_a_step_leave_one_sources_pair(tmp_path, monkeypatch):
    run_dir, ckpt = train_nemo(tmp_path, monkeypatch)
    import_checkpoint_tree(str(run_dir), str(ckpt), val_start_at=2)
    work = tmp_path / "nemo_eval"
    (work / "view").mkdir(parents=True)
    (work / "view" / f"step_{STEP}").symlink_to(ckpt / f"step_{STEP}")
    monkeypatch.setenv("MLPERF_MLLOG_FILE", str(work / "mllog.log"))
    argv = ["--checkpoint-root", str(work / "view"), "--log-dir", str(work), "--accuracy", "0.5"]
    assert nemo_evaluator.main(argv) == 0
    log = str(work / "mllog.log")
    records = attempt_records(tmp_path / "attempts.jsonl")

    at_hook, release = threading.Event(), threading.Event()

    def pause_a(summary_path: str) -> None:
        if threading.current_thread().name == "A":
            at_hook.set()
            release.wait()

    monkeypatch.setattr(eval_import, "attempts_written", pause_a)
    errors: list[BaseException] = []

    def run(target: Callable[[], object]) -> None:
        try:
            target()
        except BaseException as e:  # reported by the assertion below
            errors.append(e)

    a = threading.Thread(
        name="A",
        target=run,
        args=(lambda: eval_import.import_eval(str(run_dir), STEP, records, eval_times_from=log),),
    )
    b = threading.Thread(
        name="B",
        target=run,
        args=(lambda: eval_import.import_eval(str(run_dir), STEP, log, fmt="nemo-rl-mllog"),),
    )
    a.start()
    at_hook.wait()
    b.start()  # without one unit, B writes all of it while A waits between its writes
    b.join(timeout=2)  # orders the interleaving only; the assertions do not depend on it
    release.set()
    a.join()
    b.join()
    assert not errors, errors
    summary = read_summary(RunLayout(str(run_dir)).summary(STEP))
    copied = Path(attempts_file(str(run_dir), STEP))
    if summary.attempt_records:  # A's whole
        assert copied.read_text() == Path(records).read_text()
        assert summary.eval_accuracy == 200 / 251
    else:  # B's whole: NeMo-RL's accuracy only, no attempts beside it
        assert not copied.exists()
        assert summary.eval_accuracy == 0.5
