"""report.html: report.md rendered, with the convergence plot inline and beside it as files."""

from __future__ import annotations

from pathlib import Path

from devtools.synthetic_run import make_run
from rcpflow.verdict.finalize import finalize
from tasks.submission.report import render_report
from tasks.submission.spec import SubmissionSpec
from tasks.views.convergence import render
from tasks.views.html_report import render_html, write_html_report
from tasks.views.storage_index import convergence, read_run


def _spec(tmp_path: Path, name: str) -> SubmissionSpec:
    """A closed-division submission of three seeds, 24 steps at most, under `tmp_path`/`name`."""
    return SubmissionSpec(
        name=name, out_dir=str(tmp_path / name), seeds=(1, 2, 3), global_batch_size=256,
        max_steps=24, val_start_at=None, target=0.69, division="closed", backend="local",
        system={},
    )  # fmt: skip


def test_html_report_is_the_markdown_with_the_plot(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "h")
    for seed, step in ((1, 19), (2, 20), (3, 30)):
        accuracies = {s: (0.75 if s == step else 0.5) for s in range(18, min(step, 24) + 1)}
        make_run(spec.run_dir(seed), seed=seed, accuracies=accuracies)
        finalize(spec.run_dir(seed))
    markdown, _ = render_report(spec)
    runs = [read_run(spec.run_dir(s), f"seed {s}") for s in spec.seeds]
    path = write_html_report(spec.out_dir, markdown, "submission h", runs)

    page = Path(path).read_text()
    assert Path(path).name == "report.html"
    assert "<h1>qwen35_397b_grpo submission <code>h</code></h1>" in page
    assert page.count("<table>") == 1 and "<td>aborted</td>" in page  # seed 3 never passed
    assert "<td>aborted: no checkpoint reached the target by step 24</td>" in page
    assert "converged at step 19" in page
    assert "<figure id='convergence'><svg" in page and "reference RCP: 4608 samples" in page
    data = convergence("submission h", runs)
    assert (tmp_path / "h" / "convergence.png").read_bytes() == render(data, "png")
    assert (tmp_path / "h" / "convergence.svg").read_bytes() == render(data, "svg")
    assert render_html(markdown, "submission h", runs)[0] == page  # same inputs, same bytes


def test_raw_html_in_the_markdown_is_escaped() -> None:
    page, _, _ = render_html("# a <script>x</script>\n", "t", [])
    assert "<script>" not in page and "&lt;script&gt;" in page


def test_the_report_task_writes_both(tmp_path: Path) -> None:
    from tasks.submission.report import write_report

    spec = _spec(tmp_path, "w")
    for seed in spec.seeds:
        make_run(spec.run_dir(seed), seed=seed, accuracies={18: 0.8})
        finalize(spec.run_dir(seed))
    path, passed = write_report(spec)
    assert not passed  # no checker ran
    markdown = Path(path).read_text()
    assert markdown.count("converged at step 18") == 3
    page = (tmp_path / "w" / "report.html").read_text()
    assert "<figure id='convergence'><svg" in page and "seed 3: passes at step 18" in page
