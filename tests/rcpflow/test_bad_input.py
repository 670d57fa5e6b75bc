"""The bad-input probes of issue 10 (D2-D9 and the duplicate-key / temp-file items), each a test
named for its defect. CLI probes run `python -m rcpflow` as a user would and require one line
``invalid: ...``, exit 1, no traceback, and the run's files byte for byte as they were."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from file_tree import tree_bytes
from synthetic_run import make_run, write_eval

from rcpflow import logtext
from rcpflow.checkers import compliance
from rcpflow.finalize import finalize
from rcpflow.manifest import ManifestError, load
from rcpflow.mllog import parse, read_events
from rcpflow.storage import LocalStorage

ROOT = Path(__file__).resolve().parents[2]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}


def _cli(*args: str, env: dict[str, str] | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rcpflow", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env or _env(),
        **kw,
    )


def _assert_invalid(p: subprocess.CompletedProcess, *needles: str) -> str:
    out = p.stdout + p.stderr
    assert "Traceback" not in out, out
    assert p.returncode == 1, out
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("invalid: "), out
    for needle in needles:
        assert needle in lines[0], out
    return lines[0]


def _run(tmp_path: Path, name: str = "run", **kw):
    kw.setdefault("accuracies", {18: 0.5, 19: 0.8})
    return make_run(str(tmp_path / name), **kw)


def _log(run) -> Path:
    return Path(run.layout.mllog(run.seed))


def _append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


# -- D2: logs read as the official parser reads them; non-UTF-8 manifests and summaries ------


NOISE = (
    b"step 3 loss 0.25 \xff\xfe caf\xe9 progress\r\n"  # latin-1 bytes: not UTF-8
    b"\x85 a NEL, and a CR-only line\rtqdm 42%|\xe2\x96\x88\n"
)


def test_d2_non_utf8_bytes_in_mllog(tmp_path):
    run = _run(tmp_path)
    _append(_log(run), NOISE)
    training = _log(run).read_bytes()
    result = finalize(run.run_dir)
    assert (result.status, result.step) == ("success", 19)
    written = _log(run).read_bytes()
    assert written.startswith(training)  # the training section, byte for byte
    finalize(run.run_dir)
    assert _log(run).read_bytes() == written  # and a rerun gives the same bytes
    verdict = compliance(str(_log(run)), division="closed", log_dir=str(tmp_path / "chk"))
    assert verdict.ok, verdict.output
    p = _cli("check", str(_log(run)))
    assert p.returncode == 0 and "PASSED" in p.stdout, p.stdout + p.stderr


def test_d2_events_found_as_the_official_parser_finds_them(tmp_path):
    from mlperf_logging.compliance_checker import mlp_parser

    run = _run(tmp_path)
    line = (
        ':::MLLOG {"namespace": "", "time_ms": 5, "event_type": "POINT_IN_TIME", '
        '"key": "KEY", "value": 1, "metadata": {}}'
    )
    _append(
        _log(run),
        NOISE
        + f"[rank 3] {line.replace('KEY', 'rank_prefixed')}\r".encode()
        # two tokens on one line: the parser takes the JSON after the last one
        + f"{line.replace('KEY', 'first')} {line.replace('KEY', 'last')}\xa0\n".encode("latin-1")
        + f"noise{line.replace('KEY', 'cr_ended')}\r".encode(),
    )
    ours = [e.key for e in read_events(str(_log(run)))]
    official, errors = mlp_parser.parse_file(str(_log(run)), ruleset="6.1.0")
    assert errors == []
    assert ours == [ll.key for ll in official]
    assert ours[-3:] == ["rank_prefixed", "last", "cr_ended"]


def test_d2_lines_split_as_text_mode_splits_them():
    text = "a\r\nb\rc\nd\x85e\u2028f"
    assert logtext.lines(text, keepends=True) == ["a\r\n", "b\r", "c\n", "d\x85e\u2028f"]
    assert logtext.decode(logtext.encode(text[:-2])) == text[:-2]
    assert bytes(range(256)) == logtext.encode(logtext.decode(bytes(range(256))))


def test_d2_non_utf8_manifest_is_invalid(tmp_path):
    run = _run(tmp_path)
    _append(Path(run.layout.manifest), b'{"step": "\xff"}\n')
    before = tree_bytes(tmp_path)
    for args in (("finalize", run.run_dir), ("manifest", "validate", run.layout.manifest)):
        _assert_invalid(_cli(*args), "line 8: not UTF-8 (byte 0xff")
    assert tree_bytes(tmp_path) == before


def test_d2_non_utf8_summary_is_invalid(tmp_path):
    run = _run(tmp_path)
    summary = Path(run.layout.summary(18))
    summary.write_bytes(summary.read_bytes().replace(b'"fatal_error": null', b'"x": "\xe9"'))
    before = tree_bytes(tmp_path)
    _assert_invalid(_cli("finalize", run.run_dir), "step 18", "not UTF-8")
    assert tree_bytes(tmp_path) == before


# -- D3: a row's mllog_file must be this run's own log ---------------------------------------


def test_d3_mllog_file_outside_the_run_is_invalid(tmp_path):
    run = _run(tmp_path)
    other = _run(tmp_path, "other", seed=5)
    manifest = Path(run.layout.manifest)
    manifest.write_text(
        manifest.read_text().replace('"seed_1.out"', '"../../other/mllog/seed_5.out"')
    )
    before = tree_bytes(tmp_path)
    for args in (("finalize", run.run_dir), ("manifest", "validate", str(manifest))):
        _assert_invalid(_cli(*args), "step 18: mllog_file", "not this run's MLLOG")
    assert tree_bytes(tmp_path) == before  # neither this run's log nor the other's touched
    assert finalize(other.run_dir).status == "success"  # the other run is fine on its own


def test_d3_own_log_by_absolute_path_is_accepted(tmp_path):
    run = _run(tmp_path)
    manifest = Path(run.layout.manifest)
    manifest.write_text(
        manifest.read_text().replace(
            '"seed_1.out"', json.dumps(str(tmp_path / "run/mllog/seed_1.out"))
        )
    )
    assert load(str(manifest)).rows[0].mllog_file.endswith("seed_1.out")
    assert finalize(run.run_dir).status == "success"


# -- D4: the training section's structure before any run_stop --------------------------------


def _drop_lines(path: Path, key: str) -> None:
    kept = [
        ln
        for ln in logtext.lines(logtext.read(str(path)), keepends=True)
        if f'"key": "{key}"' not in ln
    ]
    path.write_bytes(logtext.encode("".join(kept)))


def _duplicate_line(path: Path, key: str) -> None:
    lines = logtext.lines(logtext.read(str(path)), keepends=True)
    (i,) = [n for n, ln in enumerate(lines) if f'"key": "{key}"' in ln]
    path.write_bytes(logtext.encode("".join([*lines[: i + 1], lines[i], *lines[i + 1 :]])))


@pytest.mark.parametrize("accuracies", [{18: 0.5, 19: 0.8}, {s: 0.1 for s in range(18, 25)}])
def test_d4_no_block_stop_is_incomplete_and_says_resume(tmp_path, accuracies):
    # A crash between the last row and block_stop: success or aborted would be a log the
    # checker rejects (block_stop is required); the trainer's resume writes it.
    run = _run(tmp_path, accuracies=accuracies)
    _drop_lines(_log(run), "block_stop")
    result = finalize(run.run_dir)
    assert result.status == "incomplete"
    assert "no block_stop" in result.reason and result.reason.endswith(
        "rerun the trainer to resume"
    )
    assert [e for e in read_events(str(_log(run))) if e.key == "run_stop"] == []
    p = _cli("finalize", run.run_dir)
    assert p.returncode == 3 and json.loads(p.stdout.splitlines()[-1]) == {"status": "incomplete"}


def test_d4_two_run_start_is_incomplete(tmp_path):
    run = _run(tmp_path)
    finalize(run.run_dir)  # an earlier finalize ended it: the new verdict must drop its run_stop
    _duplicate_line(_log(run), "run_start")
    result = finalize(run.run_dir)
    assert result.status == "incomplete"
    assert "2 run_start events" in result.reason and "resume" not in result.reason
    assert [e.key for e in read_events(str(_log(run))) if e.key == "run_stop"] == []
    # The checker also flags it (a warning without --werror, a failure with it).
    verdict = compliance(str(_log(run)), division="closed", log_dir=str(tmp_path / "chk"))
    assert "EXACTLY_ONE occurrence of 'run_start' but found 2" in verdict.output


def test_d4_block_stop_before_the_last_row_is_incomplete(tmp_path):
    run = _run(tmp_path, max_steps=20, last_step=19, accuracies={18: 0.1, 19: 0.2})
    from rcpflow.manifest import upsert

    upsert(run.layout.manifest, run.row(20))  # a checkpoint after training "ended"
    write_eval(run, 20, 0.9)
    result = finalize(run.run_dir)
    assert result.status == "incomplete" and "before step 20's weight update" in result.reason


def test_d4_closed_division_val_start_override_is_incomplete(tmp_path):
    run = _run(tmp_path, val_start_at=5, max_steps=8, accuracies={5: 0.1, 6: 0.8})
    result = finalize(run.run_dir)
    assert result.status == "incomplete" and "val_start_at 5" in result.reason
    open_run = _run(tmp_path, "open", division="open", val_start_at=5, max_steps=8,
                    accuracies={5: 0.1, 6: 0.8})  # fmt: skip
    assert finalize(open_run.run_dir).status == "success"


MUTATIONS = {
    "no block_stop": lambda p: _drop_lines(p, "block_stop"),
    "no init_stop": lambda p: _drop_lines(p, "init_stop"),
    "no config_filename": lambda p: _drop_lines(p, "config_filename"),
    "no block_start": lambda p: _drop_lines(p, "block_start"),
    "another benchmark": lambda p: p.write_bytes(
        p.read_bytes().replace(b'"value": "qwen35_397b_grpo"', b'"value": "llama31_8b"')
    ),
    "tensor_parallelism twice, two values": lambda p: _append(
        p,
        b':::MLLOG {"namespace": "", "time_ms": 1700000000000, "event_type": "POINT_IN_TIME", '
        b'"key": "tensor_parallelism", "value": 2, "metadata": {}}\n',
    ),
}


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_d4_rules_reject_what_the_checker_rejects(tmp_path, mutation):
    """Each structural rule against the official checker: on a log finalize had ended with
    success, the mutation makes the checker fail, and finalize then refuses to end it."""
    run = _run(tmp_path)
    assert finalize(run.run_dir).status == "success"
    MUTATIONS[mutation](_log(run))
    verdict = compliance(str(_log(run)), division="closed", log_dir=str(tmp_path / "chk"))
    assert not verdict.ok
    result = finalize(run.run_dir)
    assert result.status == "incomplete", result.reason
    assert result.reason.startswith("training section: ")


def test_d4_exactly_one_keys_are_the_official_rules():
    import importlib.util

    import yaml

    from rcpflow.training_section import EXACTLY_ONE_BY_DIVISION, EXACTLY_ONE_COMMON

    spec = importlib.util.find_spec("mlperf_logging.compliance_checker")
    assert spec is not None and spec.origin is not None
    rules = Path(spec.origin).parent / "training_6.1.0"

    def exactly_one(name: str) -> set[str]:
        records = yaml.load((rules / name).read_text(), Loader=yaml.BaseLoader)
        return {
            r["KEY"]["NAME"] for r in records if "KEY" in r and r["KEY"].get("REQ") == "EXACTLY_ONE"
        }

    for division in ("closed", "open"):
        official = (
            exactly_one("common.yaml")
            | exactly_one(f"{division}_common.yaml")
            | exactly_one(f"{division}_qwen35_397b_grpo.yaml")
        ) - {"run_stop"}
        ours = set(EXACTLY_ONE_COMMON) | set(EXACTLY_ONE_BY_DIVISION[division])
        assert ours == official, division


# -- D6: every probe through the CLI is one `invalid:` line, exit 1, nothing touched ---------

DEEP = "[" * 100_000 + "]" * 100_000


def _mllog_line(**fields: object) -> str:
    d = {"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME", "key": "x", "value": 1,
         "metadata": {}, **fields}  # fmt: skip
    return ":::MLLOG " + json.dumps(d)


def _deep_mllog(run):
    line = _mllog_line(value=0).replace('"value": 0', '"value": ' + DEEP)
    _append(_log(run), (line + "\n").encode())
    needle = "nested deeper than 64 levels"
    return [(("finalize", run.run_dir), needle), (("check", str(_log(run))), needle)]


def _infinite_time(run):
    _append(_log(run), (_mllog_line(time_ms=float("inf")) + "\n").encode())
    needle = "time_ms inf is not a finite number"
    return [(("finalize", run.run_dir), needle), (("check", str(_log(run))), needle)]


def _deep_manifest(run):
    _append(Path(run.layout.manifest), f'{{"step": {DEEP}}}\n'.encode())
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
    _log(run).unlink()
    _log(run).mkdir()
    needle = f"{_log(run)}: Is a directory"
    return [(("finalize", run.run_dir), needle), (("check", str(_log(run))), needle)]


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
        (("finalize", str(a_file)), "a-file/mllog/eval_checkpoints.jsonl: Not a directory"),
        (("check", str(a_file / "x.out")), "a-file/x.out': no such MLLOG"),
    ]


def _mllog_folder_is_a_file(run):
    shutil.rmtree(run.layout.mllog_dir)
    Path(run.layout.mllog_dir).write_text("not a folder")
    needle = "mllog/eval_checkpoints.jsonl: Not a directory"
    return [
        (("finalize", run.run_dir), needle),
        (("manifest", "validate", run.layout.manifest), needle),
        (("check", run.layout.mllog(1)), "no such MLLOG"),
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
    return [(("check", str(_log(run)), "--log-dir", str(a_file)), "a-file: File exists")]


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
def test_d6_probe_is_one_invalid_line(tmp_path, probe):
    run = _run(tmp_path)
    commands = PROBES[probe](run)
    before = tree_bytes(tmp_path)
    for args, needle in commands:
        _assert_invalid(_cli(*args, cwd=tmp_path), needle)
    assert tree_bytes(tmp_path) == before


def test_d6_gcs_without_credentials_is_one_invalid_line(tmp_path):
    env = {
        k: v
        for k, v in _env().items()
        if not k.startswith(("GOOGLE_", "STORAGE_EMULATOR", "GCE_", "CLOUDSDK_"))
    }
    env.update(
        HOME=str(tmp_path),
        CLOUDSDK_CONFIG=str(tmp_path / "gcloud"),  # no application-default credentials file
        NO_GCE_CHECK="true",  # and no metadata-server probe (nor a reachable one, if it ran)
        GCE_METADATA_HOST="127.0.0.1:9",
        GCE_METADATA_IP="127.0.0.1:9",
        GCE_METADATA_TIMEOUT="1",
    )
    for args in (
        ("finalize", "gs://rcpflow-no-such-bucket/run"),
        ("manifest", "validate", "gs://rcpflow-no-such-bucket/run/mllog/eval_checkpoints.jsonl"),
        ("check", "gs://rcpflow-no-such-bucket/run/mllog/seed_1.out"),
    ):
        _assert_invalid(
            _cli(*args, env=env), "gs://rcpflow-no-such-bucket/run", "no Google Cloud credentials"
        )


# -- D7: modes and links -------------------------------------------------------------------


def _mode(path: Path | str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_d7_files_honour_the_umask(tmp_path):
    s = LocalStorage()
    old = os.umask(0o027)
    try:
        s.write_atomic(str(tmp_path / "new.json"), b"{}")
        s.update(str(tmp_path / "new.jsonl"), lambda _: b"{}\n")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "new.json") == 0o640
    assert _mode(tmp_path / "new.jsonl") == 0o640
    os.chmod(tmp_path / "new.json", 0o604)
    s.write_atomic(str(tmp_path / "new.json"), b"[]")  # a replaced file keeps its mode
    assert _mode(tmp_path / "new.json") == 0o604


def test_d7_finalize_keeps_the_log_mode(tmp_path):
    run = _run(tmp_path)
    os.chmod(_log(run), 0o644)
    p = _cli("finalize", run.run_dir, umask=0o077)
    assert p.returncode == 0, p.stderr
    assert _mode(_log(run)) == 0o644  # not 0o600, whatever the umask: a replaced file's mode


def test_d7_symlinked_log_stays_a_link(tmp_path):
    run = _run(tmp_path)
    elsewhere = tmp_path / "logs" / "seed_1.out"
    elsewhere.parent.mkdir()
    shutil.move(_log(run), elsewhere)
    _log(run).symlink_to(os.path.relpath(elsewhere, _log(run).parent))
    assert finalize(run.run_dir).status == "success"
    assert _log(run).is_symlink()
    assert [e.key for e in read_events(str(elsewhere))].count("run_stop") == 1
    assert sorted(os.listdir(elsewhere.parent)) == [".seed_1.out.lock", "seed_1.out"]


# -- D8: non-positive numbers ----------------------------------------------------------------


@pytest.mark.parametrize(
    "field",
    ["step", "val_start_at", "global_batch_size", "max_steps", "batch_size", "num_generations",
     "timestamp_ms", "samples_count"],
)  # fmt: skip
@pytest.mark.parametrize("value", [0, -1])
def test_d8_non_positive_numbers_are_invalid(tmp_path, field, value):
    run = _run(tmp_path, max_steps=18, accuracies={})
    row = dataclasses.replace(run.row(18), **{field: value})
    Path(run.layout.manifest).write_text(row.to_json() + "\n")
    with pytest.raises(ManifestError, match=f"line 1: {field} must be positive, got {value}"):
        load(run.layout.manifest)


def test_d8_negative_step_and_val_start_via_cli(tmp_path):
    run = _run(tmp_path, max_steps=18, accuracies={})
    row = dataclasses.replace(run.row(18), step=-1, val_start_at=-1, samples_count=-256)
    Path(run.layout.manifest).write_text(row.to_json() + "\n")
    _assert_invalid(_cli("manifest", "validate", run.layout.manifest), "must be positive")


# -- D9: two identical concurrent finalizes --------------------------------------------------


def _blocked_waiters(lock_file: Path) -> int:
    inode = os.stat(lock_file).st_ino
    with open("/proc/locks") as f:
        return sum(1 for ln in f if "->" in ln and ln.split()[6].endswith(f":{inode}"))


def _wait_blocked(lock_file: Path, procs: list[subprocess.Popen], n: int) -> None:
    deadline = time.monotonic() + 120
    while _blocked_waiters(lock_file) < n:
        assert time.monotonic() < deadline, f"{n} finalize(s) should be waiting on the lock"
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.05)


def test_d9_two_identical_concurrent_finalizes_both_exit_0(tmp_path):
    run = _run(tmp_path)
    lock_file = _log(run).parent / f".{_log(run).name}.lock"
    # Hold the log's lock so that both processes read the log before either writes: the
    # interleaving in which the second used to fail with "changed while finalizing".
    with open(lock_file, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        procs = [
            subprocess.Popen([sys.executable, "-m", "rcpflow", "finalize", run.run_dir],
                             env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)
        ]  # fmt: skip
        _wait_blocked(lock_file, procs, 2)
        fcntl.flock(lock, fcntl.LOCK_UN)
    outcomes = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outcomes
    written = _log(run).read_bytes()
    assert [e.key for e in parse(logtext.decode(written))].count("run_stop") == 1
    finalize(run.run_dir)
    assert _log(run).read_bytes() == written


def test_d9_a_different_concurrent_write_still_fails_loudly(tmp_path):
    run = _run(tmp_path)
    lock_file = _log(run).parent / f".{_log(run).name}.lock"
    with open(lock_file, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        proc = subprocess.Popen([sys.executable, "-m", "rcpflow", "finalize", run.run_dir],
                                env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)  # fmt: skip
        _wait_blocked(lock_file, [proc], 1)
        _append(_log(run), b"late trainer output\n")  # between finalize's read and its write
        with_late_line = _log(run).read_bytes()
        fcntl.flock(lock, fcntl.LOCK_UN)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "changed while finalizing" in err, err
    assert _log(run).read_bytes() == with_late_line


# -- duplicate keys, temp folders and files --------------------------------------------------


def test_duplicate_key_in_a_manifest_row_is_invalid(tmp_path):
    run = _run(tmp_path)
    m = Path(run.layout.manifest)
    lines = m.read_text().splitlines()
    lines[2] = lines[2].replace('"seed": 1', '"seed": 1, "seed": 2')
    m.write_text("\n".join(lines) + "\n")
    before = tree_bytes(tmp_path)
    _assert_invalid(_cli("finalize", run.run_dir), "line 3: duplicate key 'seed'")
    _assert_invalid(_cli("manifest", "validate", str(m)), "line 3: duplicate key 'seed'")
    assert tree_bytes(tmp_path) == before


def test_duplicate_key_in_a_summary_is_invalid(tmp_path):
    run = _run(tmp_path)
    path = Path(run.layout.summary(19))
    text = path.read_text()
    path.write_text(text.replace('"complete": true', '"complete": false,\n  "complete": true'))
    before = tree_bytes(tmp_path)
    line = 1 + text[: text.index('"complete"')].count("\n") + 1
    _assert_invalid(
        _cli("finalize", run.run_dir), "step 19", f"line {line}: duplicate key 'complete'"
    )
    assert tree_bytes(tmp_path) == before


def test_check_leaves_no_temp_folder(tmp_path):
    run = _run(tmp_path)
    finalize(run.run_dir)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    p = _cli("check", str(_log(run)), env=_env(TMPDIR=str(tmp)), cwd=tmp_path)
    assert p.returncode == 0 and "its log: not kept" in p.stdout, p.stdout + p.stderr
    assert list(tmp.iterdir()) == []


KILL_AT_RENAME = (
    "import os, signal, sys\n"
    "os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)\n"
    "from rcpflow.cli import main\n"
    "sys.exit(main(['finalize', sys.argv[1]]))\n"
)


def test_killed_finalize_leaves_no_temp_file_that_matters(tmp_path):
    """SIGKILL between writing the new log and renaming it over the old one: the log is as it
    was, the temp file is a dot file no listing shows, and the next write of the log removes it
    (its writer's process is gone)."""
    run = _run(tmp_path)
    before = _log(run).read_bytes()
    p = subprocess.run([sys.executable, "-c", KILL_AT_RENAME, run.run_dir], env=_env(), timeout=120)
    assert p.returncode == -signal.SIGKILL
    assert _log(run).read_bytes() == before
    temps = [f for f in os.listdir(_log(run).parent) if f.endswith(".tmp")]
    assert len(temps) == 1 and temps[0].startswith(".seed_1.out.")
    assert LocalStorage().list(run.layout.mllog_dir) == sorted(
        [str(_log(run)), run.layout.manifest]
    )
    assert _cli("finalize", run.run_dir).returncode == 0
    assert [f for f in os.listdir(_log(run).parent) if f.endswith(".tmp")] == []


def test_live_or_foreign_temp_files_are_left_alone(tmp_path):
    from rcpflow.storage import _HOST

    target = tmp_path / "x.json"
    ours = tmp_path / f".x.json.{_HOST}.{os.getpid()}.abcd1234.tmp"  # a live writer (us)
    foreign = tmp_path / ".x.json.another-host.1.abcd1234.tmp"  # can't tell: keep
    for f in (ours, foreign):
        f.write_bytes(b"")
    LocalStorage().write_atomic(str(target), b"{}")
    assert ours.exists() and foreign.exists()


def test_duplicate_key_or_non_utf8_in_an_imported_summary_is_invalid(tmp_path):
    from rcpflow.eval_import import EvalImportError, import_eval

    run = _run(tmp_path, accuracies={18: 0.5})
    text = Path(run.layout.summary(18)).read_text()
    source = tmp_path / "foreign" / "summary.json"
    source.parent.mkdir()
    source.write_text(text.replace('"complete": true', '"complete": false,\n  "complete": true'))
    with pytest.raises(EvalImportError, match="duplicate key 'complete'"):
        import_eval(run.run_dir, 18, str(source))
    source.write_bytes(text.replace('"fatal_error": null', '"x": "\xe9"').encode("latin-1"))
    with pytest.raises(EvalImportError, match="not UTF-8"):
        import_eval(run.run_dir, 18, str(source))


def test_non_utf8_attempts_file_makes_the_summary_invalid_naming_it(tmp_path):
    from rcpflow.verify import attempts_file, evaluate_step

    run = _run(tmp_path)
    path = Path(attempts_file(run.run_dir, 18))
    path.parent.mkdir(parents=True)
    path.write_bytes(b'{"instance": 0, "attempt": 0, "status": "r\xe9solved"}\n')
    found = evaluate_step(run.run_dir, run.row(18))
    assert found.state == "invalid"
    assert any("attempts.jsonl: line 1: not UTF-8" in p for p in found.problems), found.problems
    assert finalize(run.run_dir).status == "incomplete"
