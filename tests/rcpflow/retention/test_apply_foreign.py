"""Retention on a foreign trainer's tree (NeMo-RL's step_<N>/ outside the run folder, written by
the stand-in of tests/foreign): nothing is deleted from it unless the caller names the tree, and
then only what the run's manifest rows and their verified summaries allow, never what the
trainer's own files say."""

from __future__ import annotations

import json
from pathlib import Path

from nemo_runs import evaluate_nemo, train_nemo
from rcpflow_cli import run_cli

from rcpflow.files.layout import RunLayout
from rcpflow.retention.apply import apply_run, plan_run
from rcpflow.trainer.nemo_rl_import import import_checkpoint_tree
from rcpflow.verdict.eval_import import import_eval


def _goes(run_dir: str, **kw) -> dict[int, str]:
    return {
        p.decision.step: p.decision.reason
        for p in plan_run(run_dir, **kw)
        if p.decision.goes and p.decision.part == "checkpoint"
    }


def test_a_nemo_rl_tree_is_deleted_from_only_when_named_and_only_as_verified(tmp_path, monkeypatch):
    run_path, ckpt = train_nemo(tmp_path, monkeypatch, keep_top_k=8)
    run_dir = str(run_path)
    assert not str(ckpt).startswith(RunLayout(run_dir).checkpoints_dir)  # outside the run
    import_checkpoint_tree(run_dir, str(ckpt), val_start_at=2)
    for step, accuracy in ((2, "0.5"), (3, "0.5"), (4, "0.8")):
        log = evaluate_nemo(tmp_path, monkeypatch, ckpt, step, "--accuracy", accuracy)
        import_eval(run_dir, step, str(log), fmt="nemo-rl-mllog")
    # step 3's summary no longer matches its checkpoint's row: not verified, so not deletable,
    # and the verdict is not decided at step 4 either
    summary3 = Path(RunLayout(run_dir).summary(3))
    data = json.loads(summary3.read_text())
    summary3.write_text(json.dumps({**data, "checkpoint_timestamp_ms": 1}))

    reasons = {p.decision.step: p.decision.reason for p in plan_run(run_dir)}
    assert set(reasons.values()) == {"outside the run's checkpoint tree (never deleted)"}
    trees = (str(ckpt),)
    goes = _goes(run_dir, trees=trees)
    assert goes == {2: "evaluated below the target"}
    kept = {p.decision.step: p.decision.reason for p in plan_run(run_dir, trees=trees)}
    assert kept[3].startswith("summary not valid: checkpoint_timestamp_ms: 1 != manifest's")
    assert kept[3].endswith("(a summary of another checkpoint) (re-evaluation pending)")
    assert kept[4] == "passes the target; the verdict is not decided yet"
    # NeMo-RL's own record of a checkpoint decides nothing: a training_info.json that says
    # anything leaves the plan as it was
    info = ckpt / "step_5" / "training_info.json"
    info.write_text(json.dumps({**json.loads(info.read_text()), "val_reward": 0.0}))
    assert _goes(run_dir, trees=trees) == goes

    done = apply_run(run_dir, trees=trees)
    assert [p["step"] for p in done["parts"] if p.get("outcome") == "deleted"] == [2]  # type: ignore[attr-defined]
    assert not (ckpt / "step_2").exists() and (ckpt / "step_3" / "policy").is_dir()

    summary3.write_text(json.dumps(data))  # verified again: the run is decided at step 4
    p = run_cli("retention", "plan", run_dir, "--settled", "--tree", str(ckpt))
    assert p.returncode == 0, p.stderr
    assert "step 3: goes (evaluated below the target)" in p.stdout
    assert "step 5: goes (above the passing step 4, not evaluated" in p.stdout
    assert "step 4: kept (the passing checkpoint, kept by the policy (keep passing))" in p.stdout
    p = run_cli("retention", "apply", run_dir, "--settled", "--tree", str(ckpt))
    assert p.returncode == 0, p.stderr
    assert sorted(d.name for d in ckpt.iterdir()) == ["step_4"]
