"""Bad input through the CLI, as a user runs it: each probe (too deep JSON, a non-finite number,
a folder where a file belongs or the reverse, empty paths, ``gs://`` without credentials) is one
line ``invalid: ...``, exit 1, no traceback, and the run's files byte for byte as they were."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from file_tree import append_bytes, tree_bytes
from rcpflow_cli import assert_one_invalid_line, cli_env, cli_env_without_gcs_credentials, run_cli

from devtools.synthetic_run import passing_run
from rcpflow.verdict.finalize import finalize

DEEP = "[" * 100_000 + "]" * 100_000


def _mllog_line(**fields: object) -> str:
    d = {"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME", "key": "x", "value": 1,
         "metadata": {}, **fields}  # fmt: skip
    return ":::MLLOG " + json.dumps(d)


def _deep_mllog(run):
    line = _mllog_line(value=0).replace('"value": 0', '"value": ' + DEEP)
    append_bytes(run.log_file, (line + "\n").encode())
    needle = "nested deeper than 64 levels"
    return [(("finalize", run.run_dir), needle), (("check", str(run.log_file)), needle)]


def _infinite_time(run):
    append_bytes(run.log_file, (_mllog_line(time_ms=float("inf")) + "\n").encode())
    needle = "time_ms inf is not a finite number"
    return [(("finalize", run.run_dir), needle), (("check", str(run.log_file)), needle)]


def _deep_manifest(run):
    append_bytes(Path(run.layout.manifest), f'{{"step": {DEEP}}}\n'.encode())
    needle = "line 8: nested deeper than 64 levels"
    return [
        (("finalize", run.run_dir), needle),
        (("manifest", "validate", run.layout.manifest), needle),
    ]


def _infinite_manifest_time(run):
    m = Path(run.layout.manifest)
    m.write_text(
        m.read_text().replace(
            f'"timestamp_ms": {run.row(18).timestamp_ms}', '"timestamp_ms": Infinity'
        )
    )
    needle = "line 1: Infinity is not a JSON number"
    return [(("finalize", run.run_dir), needle), (("manifest", "validate", str(m)), needle)]


def _deep_summary(run):
    Path(run.layout.summary(18)).write_text(f'{{"instances": {DEEP}}}')
    return [(("finalize", run.run_dir), "step 18: ")]


def _log_is_a_folder(run):
    run.log_file.unlink()
    run.log_file.mkdir()
    needle = f"{run.log_file}: Is a directory"
    return [(("finalize", run.run_dir), needle), (("check", str(run.log_file)), needle)]


def _summary_is_a_folder(run):
    Path(run.layout.summary(18)).unlink()
    Path(run.layout.summary(18)).mkdir()
    return [(("finalize", run.run_dir), f"{run.layout.summary(18)}: Is a directory")]


def _manifest_is_a_folder(run):
    Path(run.layout.manifest).unlink()
    Path(run.layout.manifest).mkdir()
    needle = f"{run.layout.manifest}: Is a directory"
    return [
        (("finalize", run.run_dir), needle),
        (("manifest", "validate", run.layout.manifest), needle),
    ]


def _run_dir_is_a_file(run):
    a_file = Path(run.run_dir) / "a-file"
    a_file.write_text("")
    return [
        (
            ("finalize", str(a_file)),
            f"a-file: is a file, not a run folder; did you mean {run.run_dir} ",
        ),
        (("check", str(a_file / "x.out")), f"x.out: does not exist ({a_file} is a file, not a"),
    ]


def _mllog_folder_is_a_file(run):
    shutil.rmtree(run.layout.mllog_dir)
    Path(run.layout.mllog_dir).write_text("not a folder")
    needle = "mllog/eval_checkpoints.jsonl: Not a directory"
    missing = (
        f"eval_checkpoints.jsonl: does not exist ({run.layout.mllog_dir} is a file, not a folder)"
    )
    return [
        (("finalize", run.run_dir), needle),
        (("manifest", "validate", run.layout.manifest), missing),
        (("check", run.layout.mllog(1)), f"({run.layout.mllog_dir} is a file, not a folder)"),
    ]


def _empty_paths(run):
    return [
        (("finalize", ""), "run_dir must not be empty"),
        (("manifest", "validate", ""), "the manifest path is empty"),
        (("check", ""), "'': no such MLLOG"),
    ]


def _check_log_dir_is_a_file(run):
    a_file = Path(run.run_dir) / "a-file"
    a_file.write_text("")
    return [(("check", str(run.log_file), "--log-dir", str(a_file)), "a-file: File exists")]


PROBES = {
    "deeply nested MLLOG line": _deep_mllog,
    "time_ms Infinity in the MLLOG": _infinite_time,
    "deeply nested manifest line": _deep_manifest,
    "timestamp_ms Infinity in the manifest": _infinite_manifest_time,
    "deeply nested summary": _deep_summary,
    "log is a folder": _log_is_a_folder,
    "summary is a folder": _summary_is_a_folder,
    "manifest is a folder": _manifest_is_a_folder,
    "run_dir is a file": _run_dir_is_a_file,
    "mllog folder is a file": _mllog_folder_is_a_file,
    "empty paths": _empty_paths,
    "check --log-dir is a file": _check_log_dir_is_a_file,
}


@pytest.mark.parametrize("probe", PROBES)
def test_probe_is_one_invalid_line(tmp_path, probe):
    run = passing_run(tmp_path)
    commands = PROBES[probe](run)
    before = tree_bytes(tmp_path)
    for args, needle in commands:
        assert_one_invalid_line(run_cli(*args, cwd=tmp_path), needle)
    assert tree_bytes(tmp_path) == before


def test_gcs_without_credentials_is_one_error_line(tmp_path):
    env = cli_env_without_gcs_credentials(tmp_path)
    for args in (
        ("finalize", "gs://rcpflow-no-such-bucket/run"),
        ("manifest", "validate", "gs://rcpflow-no-such-bucket/run/mllog/eval_checkpoints.jsonl"),
        ("check", "gs://rcpflow-no-such-bucket/run/mllog/seed_1.out"),
    ):
        assert_one_invalid_line(
            run_cli(*args, env=env),
            "gs://rcpflow-no-such-bucket/run",
            "no Google Cloud credentials",
            prefix="error: ",
        )


def test_check_leaves_no_temp_folder(tmp_path):
    run = passing_run(tmp_path)
    finalize(run.run_dir)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    p = run_cli("check", str(run.log_file), env=cli_env(TMPDIR=str(tmp)), cwd=tmp_path)
    assert p.returncode == 0 and "its log: not kept" in p.stdout, p.stdout + p.stderr
    assert list(tmp.iterdir()) == []
