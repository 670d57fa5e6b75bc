"""Bytes a submission's files may hold, and bytes and JSON they must not: MLLOG lines are found
as the official parser finds them (any bytes around them); manifests, summaries and attempts
files with bytes that are not UTF-8 or a key twice in one object are invalid, naming the line,
and leave every file as it was."""

from __future__ import annotations

from pathlib import Path

import pytest
from file_tree import append_bytes, tree_bytes
from rcpflow_cli import assert_one_invalid_line, run_cli

from devtools.synthetic_run import passing_run
from rcpflow.files import logtext
from rcpflow.records.mllog import read_events
from rcpflow.submission.checkers import compliance
from rcpflow.verdict.finalize import finalize

NOISE = (
    b"step 3 loss 0.25 \xff\xfe caf\xe9 progress\r\n"  # latin-1 bytes: not UTF-8
    b"\x85 a NEL, and a CR-only line\rtqdm 42%|\xe2\x96\x88\n"
)


def test_non_utf8_bytes_in_mllog(tmp_path):
    run = passing_run(tmp_path)
    append_bytes(run.log_file, NOISE)
    training = run.log_file.read_bytes()
    result = finalize(run.run_dir)
    assert (result.status, result.step) == ("success", 19)
    written = run.log_file.read_bytes()
    assert written.startswith(training)  # the training section, byte for byte
    finalize(run.run_dir)
    assert run.log_file.read_bytes() == written  # and a rerun gives the same bytes
    verdict = compliance(str(run.log_file), division="closed", log_dir=str(tmp_path / "chk"))
    assert verdict.ok, verdict.output
    p = run_cli("check", str(run.log_file))
    assert p.returncode == 0 and "PASSED" in p.stdout, p.stdout + p.stderr


def test_events_found_as_the_official_parser_finds_them(tmp_path):
    from mlperf_logging.compliance_checker import mlp_parser

    run = passing_run(tmp_path)
    line = (
        ':::MLLOG {"namespace": "", "time_ms": 5, "event_type": "POINT_IN_TIME", '
        '"key": "KEY", "value": 1, "metadata": {}}'
    )
    append_bytes(
        run.log_file,
        NOISE
        + f"[rank 3] {line.replace('KEY', 'rank_prefixed')}\r".encode()
        # two tokens on one line: the parser takes the JSON after the last one
        + f"{line.replace('KEY', 'first')} {line.replace('KEY', 'last')}\xa0\n".encode("latin-1")
        + f"noise{line.replace('KEY', 'cr_ended')}\r".encode(),
    )
    ours = [e.key for e in read_events(str(run.log_file))]
    official, errors = mlp_parser.parse_file(str(run.log_file), ruleset="6.1.0")
    assert errors == []
    assert ours == [ll.key for ll in official]
    assert ours[-3:] == ["rank_prefixed", "last", "cr_ended"]


def test_lines_split_as_text_mode_splits_them():
    text = "a\r\nb\rc\nd\x85e\u2028f"
    assert logtext.lines(text, keepends=True) == ["a\r\n", "b\r", "c\n", "d\x85e\u2028f"]
    assert logtext.decode(logtext.encode(text[:-2])) == text[:-2]
    assert bytes(range(256)) == logtext.encode(logtext.decode(bytes(range(256))))


def test_non_utf8_manifest_is_invalid(tmp_path):
    run = passing_run(tmp_path)
    append_bytes(Path(run.layout.manifest), b'{"step": "\xff"}\n')
    before = tree_bytes(tmp_path)
    for args in (("finalize", run.run_dir), ("manifest", "validate", run.layout.manifest)):
        assert_one_invalid_line(run_cli(*args), "line 8: not UTF-8 (byte 0xff")
    assert tree_bytes(tmp_path) == before


def test_non_utf8_summary_is_invalid(tmp_path):
    run = passing_run(tmp_path)
    summary = Path(run.layout.summary(18))
    summary.write_bytes(summary.read_bytes().replace(b'"fatal_error": null', b'"x": "\xe9"'))
    before = tree_bytes(tmp_path)
    assert_one_invalid_line(run_cli("finalize", run.run_dir), "step 18", "not UTF-8")
    assert tree_bytes(tmp_path) == before


def test_duplicate_key_in_a_manifest_row_is_invalid(tmp_path):
    run = passing_run(tmp_path)
    m = Path(run.layout.manifest)
    lines = m.read_text().splitlines()
    lines[2] = lines[2].replace('"seed": 1', '"seed": 1, "seed": 2')
    m.write_text("\n".join(lines) + "\n")
    before = tree_bytes(tmp_path)
    assert_one_invalid_line(run_cli("finalize", run.run_dir), "line 3: duplicate key 'seed'")
    assert_one_invalid_line(run_cli("manifest", "validate", str(m)), "line 3: duplicate key 'seed'")
    assert tree_bytes(tmp_path) == before


def test_duplicate_key_in_a_summary_is_invalid(tmp_path):
    run = passing_run(tmp_path)
    path = Path(run.layout.summary(19))
    text = path.read_text()
    path.write_text(text.replace('"complete": true', '"complete": false,\n  "complete": true'))
    before = tree_bytes(tmp_path)
    line = 1 + text[: text.index('"complete"')].count("\n") + 1
    assert_one_invalid_line(
        run_cli("finalize", run.run_dir), "step 19", f"line {line}: duplicate key 'complete'"
    )
    assert tree_bytes(tmp_path) == before


def test_duplicate_key_or_non_utf8_in_an_imported_summary_is_invalid(tmp_path):
    from rcpflow.verdict.eval_import import EvalImportError, import_eval

    run = passing_run(tmp_path, accuracies={18: 0.5})
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
    from rcpflow.verdict.verify import attempts_file, evaluate_step

    run = passing_run(tmp_path)
    path = Path(attempts_file(run.run_dir, 18))
    path.parent.mkdir(parents=True)
    path.write_bytes(b'{"instance": 0, "attempt": 0, "status": "r\xe9solved"}\n')
    found = evaluate_step(run.run_dir, run.row(18))
    assert found.state == "invalid"
    assert any("attempts.jsonl: line 1: not UTF-8" in p for p in found.problems), found.problems
    assert finalize(run.run_dir).status == "incomplete"
