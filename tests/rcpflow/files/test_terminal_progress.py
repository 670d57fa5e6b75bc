"""Progress of long CLI work: on a terminal a line redrawn in place, in a log nothing."""

from __future__ import annotations

import io
import os
import pty
import shutil
import subprocess
import sys
from pathlib import Path

from devtools.synthetic_run import make_run
from rcpflow.files.terminal_progress import Progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_line_is_redrawn_then_cleared() -> None:
    out = _Terminal()
    with Progress("importing", 2, out) as p:
        p.advance("step 18")
        p.advance("step 9")
    text = out.getvalue()
    assert "\rimporting: 1/2 (step 18)" in text
    assert "\rimporting: 2/2 (step 9) " in text  # padded over the longer line before
    assert text.endswith("\r" + " " * len("importing: 1/2 (step 18)") + "\r")


def test_in_a_log_nothing_is_written() -> None:
    out = io.StringIO()
    with Progress("importing", 2, out) as p:
        p.advance("step 18")
    assert out.getvalue() == ""


def _tree(tmp_path: Path) -> tuple[str, Path]:
    """A run and a Tunix-style tree holding one attempt of steps 18 and 19."""
    source = make_run(str(tmp_path / "source"), accuracies={18: 0.5, 19: 0.6})
    target = make_run(str(tmp_path / "target"))
    tree = tmp_path / "tree"
    for step in (18, 19):
        dst = tree / f"step_{step}" / "20260929T060823Z-f604fb47" / "summary.json"
        dst.parent.mkdir(parents=True)
        shutil.copy(source.layout.summary(step), dst)
    return target.run_dir, tree


def _cli(args: list[str], tty: bool) -> tuple[int, str, str]:
    argv = [sys.executable, "-m", "rcpflow", *args]
    if not tty:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        return p.returncode, p.stdout, p.stderr
    primary, secondary = pty.openpty()
    try:
        p = subprocess.run(
            argv, stdout=subprocess.PIPE, stderr=secondary, timeout=120, check=False, text=True
        )
        os.close(secondary)
        chunks = []
        while True:
            try:
                chunk = os.read(primary, 4096)
            except OSError:  # the terminal's other end is closed: all read
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(primary)
    return p.returncode, p.stdout, b"".join(chunks).decode()


def test_eval_import_from_tree_shows_progress_only_on_a_terminal(tmp_path: Path) -> None:
    run_dir, tree = _tree(tmp_path)
    args = ["eval", "import", run_dir, "--from-tree", str(tree)]
    code, out, err = _cli(args, tty=False)
    assert code == 0, err
    assert "importing:" not in err and "step 18: imported" in out
    code, out, err = _cli(args, tty=True)
    assert code == 0, err
    assert "importing: 1/2 (step 18)" in err and "importing: 2/2 (step 19)" in err
    assert "step 19: imported" in out  # the result lines are the same either way
