"""The HTML report beside ``report.md``: the same text, rendered, with the convergence plot.

``report.md`` stays the one source of the report's words; this renders it (markdown-it, raw
HTML in it escaped, not passed through) and adds the plot of the submission's runs (labelled by
seed), inline as SVG so ``report.html`` is one self-contained file, and beside it as
``convergence.png`` and ``convergence.svg``. Same inputs, same bytes. `rcp_section` is the
report's markdown of the RCP checker's numbers (`rcpflow.submission.rcp_numbers`), for report.md.
"""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Sequence

from rcpflow.files.layout import join
from rcpflow.files.storage import storage_for
from tasks.views.convergence import render
from tasks.views.storage_index import REPORT_HTML, RunView, convergence, rcp_numbers_of

HTML_NAME = REPORT_HTML
PLOT_NAME = "convergence"

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5rem auto; max-width: 72rem; color: #1a202c; }
table { border-collapse: collapse; } th, td { border: 1px solid #cbd5e0; padding: 0.25rem 0.6rem; }
th { background: #edf2f7; } code { font-size: 0.9em; } svg { max-width: 100%; height: auto; }
"""


def _inline_svg(svg: bytes) -> str:
    """The ``<svg>`` element of a standalone SVG file (its XML prolog and DOCTYPE dropped)."""
    text = svg.decode()
    return text[text.index("<svg") :]


def render_html(markdown: str, title: str, runs: Sequence[RunView]) -> tuple[str, bytes, bytes]:
    """(report.html, convergence.png, convergence.svg) for this report text and these runs."""
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(markdown)
    by_seed = [
        dataclasses.replace(r, path=f"seed {r.settings.seed}") if r.settings else r for r in runs
    ]
    data = convergence(title, by_seed)
    png, svg = render(data, "png"), render(data, "svg")
    page = (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>\n"
        f"{body}\n<h2>Convergence</h2>\n<figure id='convergence'>{_inline_svg(svg)}"
        f"<figcaption>pass@4 by step per seed; {html.escape(data.reference_note)}. "
        f"<a href='{PLOT_NAME}.png'>PNG</a> · <a href='{PLOT_NAME}.svg'>SVG</a></figcaption>"
        "</figure>\n</body></html>\n"
    )
    return page, png, svg


def _samples(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def rcp_section(runs: Sequence[RunView]) -> list[str]:
    """Markdown lines: the RCP checker's numbers for these runs (a submission's seeds)."""
    numbers = rcp_numbers_of(runs)
    lines = ["## RCP checker's numbers", ""]
    if numbers is None:
        return [*lines, "Unknown: the runs have no one batch size, or no usable manifest.", ""]
    per_seed = ", ".join(
        f"seed {seed} {'did not converge' if v is None else v}" for seed, v in numbers.samples
    )
    dropped = ", ".join(map(str, numbers.dropped_seeds)) or "none"
    stdev = "-" if numbers.reference_stdev is None else f"{numbers.reference_stdev:.1f}"
    return [
        *lines,
        f"- reference: {numbers.record}; mean {_samples(numbers.reference_mean)} samples, "
        f"stdev {stdev}",
        f"- minimum allowed mean: {_samples(numbers.min_allowed)} samples",
        f"- samples to converge: {per_seed}",
        f"- seeds in the score (olympic): {', '.join(map(str, numbers.scored_seeds))} "
        f"(dropped, fastest and slowest: {dropped})",
        f"- this submission's mean: {_samples(numbers.submission_mean)} samples",
        f"- {numbers.reason}",
        "",
    ]


def write_html_report(folder: str, markdown: str, title: str, runs: Sequence[RunView]) -> str:
    """Write report.html and the plot files into `folder`; returns report.html's path."""
    page, png, svg = render_html(markdown, title, runs)
    for name, data in ((f"{PLOT_NAME}.png", png), (f"{PLOT_NAME}.svg", svg)):
        path = join(folder, name)
        storage_for(path).write_atomic(path, data)
    path = join(folder, HTML_NAME)
    storage_for(path).write_atomic(path, page.encode())
    return path
