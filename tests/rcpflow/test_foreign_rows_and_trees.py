"""Foreign inputs as other tools write them: manifest rows naming the weight-update time
`timestamp_ms`, `weight_update_timestamp_ms` or `checkpoint_timestamp_ms`; checkpoint folders
without a row (unrecorded); symlinked step folders in an import tree; records under a named
format that are invalid as records of that format."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from eval_records import START, STOP, deepswe_lines, tunix_for, write_lines
from rcpflow_cli import run_cli

from devtools.synthetic_run import make_run
from rcpflow.cli.status import UNRECORDED, render_table, run_status
from rcpflow.records.manifest import load, upsert
from rcpflow.verdict.eval_import import EvalImportError, import_eval, import_results_tree


@pytest.fixture
def run(tmp_path):
    return make_run(str(tmp_path / "run"), max_steps=20)


def _rename_timestamp(manifest: str, name: str) -> None:
    rows = [json.loads(line) for line in Path(manifest).read_text().splitlines()]
    for r in rows:
        r[name] = r.pop("timestamp_ms")
    Path(manifest).write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize("name", ["weight_update_timestamp_ms", "checkpoint_timestamp_ms"])
def test_the_three_timestamp_names_are_accepted_and_written_canonically(run, name):
    before = load(run.layout.manifest).rows
    _rename_timestamp(run.layout.manifest, name)
    assert load(run.layout.manifest).rows == before
    upsert(run.layout.manifest, run.row(20))  # any write gives the one canonical name
    text = Path(run.layout.manifest).read_text()
    assert name not in text and text.count('"timestamp_ms"') == 3


def test_two_timestamp_names_that_disagree_are_invalid(run):
    rows = Path(run.layout.manifest).read_text().splitlines()
    d = json.loads(rows[1])
    rows[1] = json.dumps({**d, "weight_update_timestamp_ms": d["timestamp_ms"] + 1})
    Path(run.layout.manifest).write_text("\n".join(rows) + "\n")
    p = run_cli("manifest", "validate", run.layout.manifest)
    assert p.returncode == 1
    assert f"line 2: timestamp_ms {d['timestamp_ms']} and weight_update_timestamp_ms" in p.stderr
    assert "disagree" in p.stderr


def test_checkpoint_folders_without_a_row_are_listed_as_unrecorded(run, tmp_path):
    ckpts = Path(run.layout.checkpoints_dir)
    for rel in ("18", "19", "21", "actor/22", "21.orbax-checkpoint-tmp-1"):
        (ckpts / rel).mkdir(parents=True)
    status = run_status(run.run_dir)
    assert status.unrecorded == (str(ckpts / "21"), str(ckpts / "actor" / "22"))
    table = render_table(status)
    assert f"{ckpts / '21'}: {UNRECORDED}" in table and "unrecorded (no timestamp" in table
    os.remove(run.layout.manifest)
    p = run_cli("status", run.run_dir)
    assert p.returncode == 1 and f"{ckpts / '18'}: {UNRECORDED}" in p.stdout


def test_from_tree_follows_symlinked_step_folders_inside_and_names_those_outside(run, tmp_path):
    tree = tmp_path / "tree"
    kept = tree / "archive" / "s18" / "20260929T080000Z-1" / "summary.json"
    kept.parent.mkdir(parents=True)
    kept.write_text(json.dumps(tunix_for(run, 18, "summary_full.json")))
    (tree / "step_18").symlink_to(tree / "archive" / "s18")  # a step folder linked in the tree
    outside = tmp_path / "elsewhere" / "20260929T080000Z-2" / "summary.json"
    outside.parent.mkdir(parents=True)
    outside.write_text(json.dumps(tunix_for(run, 19, "summary_full.json")))
    (tree / "step_19").symlink_to(tmp_path / "elsewhere")  # leads out of the tree
    (tree / "archive" / "back").symlink_to(tree)  # a loop: named, never walked for ever
    result = import_results_tree(run.run_dir, str(tree))
    assert [s.step for s in result.steps] == [18] and result.steps[0].imported is not None
    skipped = sorted(result.skipped)
    assert len(skipped) == 2 and "loops back to a folder above it" in skipped[0]
    assert str(tree / "step_19") in skipped[1] and "leads out of the tree" in skipped[1]
    p = run_cli("eval", "import", run.run_dir, "--from-tree", str(tree))
    assert f"warning: {tree / 'step_19'}: a symlink to" in p.stderr


def test_invalid_records_under_format_deepswe_are_named_as_deepswe_records(run, tmp_path):
    lines = [
        json.dumps({k: v for k, v in json.loads(x).items() if k != "schema"})
        for x in deepswe_lines()
    ]
    source = write_lines(tmp_path / "d.jsonl", lines)
    with pytest.raises(EvalImportError) as e:
        import_eval(run.run_dir, 18, source, eval_times=(START, STOP), fmt="deepswe")
    assert "line 1: schema None is not canon.p46.deepswe-eval.trajectory.v4" in str(e.value)
    assert "not a valid deepswe record" in str(e.value) and "neither a summary" not in str(e.value)
    lines = deepswe_lines()
    lines[2] = lines[2].replace('"valid": true', '"valid": "yes"')
    p = run_cli(
        "eval", "import", run.run_dir, "--step", "18", "--format", "deepswe",
        write_lines(tmp_path / "d2.jsonl", lines),
        "--eval-start-ms", str(START), "--eval-stop-ms", str(STOP),
    )  # fmt: skip
    assert p.returncode == 1
    assert "line 3: valid and solved must be booleans (not a valid deepswe record)" in p.stderr


def test_from_tree_names_dangling_step_links_odd_summaries_and_unlistable_folders(run, tmp_path):
    """Never dropped silently (issue 29): a step folder that is a dangling link, a summary that
    is a FIFO, a step folder that cannot be listed."""
    tree = tmp_path / "tree"
    kept = tree / "step_18" / "20260929T080000Z-1" / "summary.json"
    kept.parent.mkdir(parents=True)
    kept.write_text(json.dumps(tunix_for(run, 18, "summary_full.json")))
    (tree / "step_19").symlink_to(tree / "archive" / "gone")  # dangling, inside the tree
    fifo = tree / "step_20" / "20260929T080000Z-1" / "summary.json"
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)  # would block a reader for ever
    locked = tree / "step_21"
    locked.mkdir()
    locked.chmod(0)
    try:
        result = import_results_tree(run.run_dir, str(tree))
    finally:
        locked.chmod(0o755)
    assert [s.step for s in result.steps] == [18]
    text = "\n".join(result.skipped)
    assert f"{tree / 'step_19'}: a symlink to" in text and "does not exist" in text
    assert f"{fifo}: not a regular file: skipped" in text
    if os.geteuid() != 0:  # root lists any folder
        assert f"{locked}: cannot be listed" in text
