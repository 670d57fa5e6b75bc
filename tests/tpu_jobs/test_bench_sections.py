"""BENCHMARKS.md's sections are rewritten one at a time without losing the others (the sizes
section used to sit inside the Tunix section's markers, so `tunix_bench` deleted it)."""

from __future__ import annotations

from pathlib import Path

from tpu_jobs.devtools.bench import SIZES_TITLE, write_sizes_section
from tpu_jobs.devtools.tunix_bench import SECTION_END, SECTION_START, write_section


def test_the_sizes_and_tunix_sections_survive_each_others_rewrites(tmp_path: Path) -> None:
    out = tmp_path / "BENCHMARKS.md"
    out.write_text(
        f"# Benchmarks\n\n## Ratios\nr\n\n{SECTION_START}\n## Tunix job\nold\n{SECTION_END}\n"
    )
    write_sizes_section(out, f"{SIZES_TITLE}\n\nsizes one\n")
    write_section(out, f"{SECTION_START}\n## Tunix job\nnew\n{SECTION_END}\n")
    assert "sizes one" in out.read_text()  # the Tunix rewrite kept it
    write_sizes_section(out, f"{SIZES_TITLE}\n\nsizes two\n")
    text = out.read_text()
    assert "sizes two" in text and "sizes one" not in text
    assert "new" in text and "old" not in text
    assert text.count(SIZES_TITLE) == 1 and text.count(SECTION_START) == 1
    assert text.index("## Ratios") < text.index(SIZES_TITLE) < text.index(SECTION_START)
