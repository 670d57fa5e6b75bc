"""BENCHMARKS.md's sections are rewritten one at a time without losing the others (the sizes
section used to sit inside the Tunix section's markers, so `tunix_bench` deleted it)."""

from __future__ import annotations

from pathlib import Path

from devtools.bench.checkpoint_bench import SIZES_TITLE, write_sizes_section
from devtools.bench.tunix_bench import SECTION_END, SECTION_START
from rcpflow.files.markdown_sections import write_section


def test_the_sizes_and_tunix_sections_survive_each_others_rewrites(tmp_path: Path) -> None:
    out = tmp_path / "BENCHMARKS.md"
    out.write_text(
        f"# Benchmarks\n\n## Ratios\nr\n\n{SECTION_START}\n## Tunix job\nold\n{SECTION_END}\n"
    )
    write_sizes_section(out, f"{SIZES_TITLE}\n\nsizes one\n")
    write_section(
        out, f"{SECTION_START}\n## Tunix job\nnew\n{SECTION_END}\n", SECTION_START, SECTION_END
    )
    assert "sizes one" in out.read_text()  # the Tunix rewrite kept it
    write_sizes_section(out, f"{SIZES_TITLE}\n\nsizes two\n")
    text = out.read_text()
    assert "sizes two" in text and "sizes one" not in text
    assert "new" in text and "old" not in text
    assert text.count(SIZES_TITLE) == 1 and text.count(SECTION_START) == 1
    assert text.index("## Ratios") < text.index(SIZES_TITLE) < text.index(SECTION_START)


def test_the_main_bench_rewrites_only_the_head(tmp_path: Path) -> None:
    from rcpflow.files.markdown_sections import write_head

    out = tmp_path / "BENCHMARKS.md"
    write_head(out, "# Benchmarks\n\n## Ratios\nold\n")
    write_section(out, "verdict", "<!-- verdict-bench:start -->", "<!-- verdict-bench:end -->")
    write_head(out, "# Benchmarks\n\n## Ratios\nnew\n")
    text = out.read_text()
    assert "new" in text and "old" not in text
    assert text.index("## Ratios") < text.index("<!-- verdict-bench:start -->\nverdict\n")


def test_the_slurm_section_is_replaced_in_place_by_the_one_writer(tmp_path: Path) -> None:
    import argparse

    from devtools.bench import slurm_bench

    def section(verdict_s: float) -> str:
        rows = [
            slurm_bench.Row(
                label,
                schedule,
                window,
                20,
                verdict_s,
                600.0,
                2,
                3,
                30,
                20.0,
                100.0,
                17.0,
                verdict_s - 10.0,
                500.0,
            )
            for label, schedule, window, _ in slurm_bench.CONFIGS
        ]
        latency = slurm_bench.Latency([0.5, 0.6], [1.0, 1.2], [0.3, 0.4])
        args = argparse.Namespace(seed=1, max_steps=30, scale=0.01)
        facts = {"date": "2026-12-05 12:00 UTC", "load": "1.0, 1.0, 1.0"}
        return slurm_bench.section(rows, latency, args, "22.05", facts)

    out = tmp_path / "BENCHMARKS.md"
    write_section(out, "verdict", "<!-- verdict-bench:start -->", "<!-- verdict-bench:end -->")
    for verdict_s in (111.0, 222.0):  # the second run replaces the first
        write_section(out, section(verdict_s), slurm_bench.START, slurm_bench.END)
        write_section(out, "tail", "<!-- z:start -->", "<!-- z:end -->")
    text = out.read_text()
    assert text.count(slurm_bench.START) == 1 and text.count(slurm_bench.END) == 1
    assert "222" in text and "111" not in text
    assert text.index("verdict\n") < text.index(slurm_bench.START) < text.index("<!-- z:start")


def test_the_slurm_poll_block_survives_the_slurm_sections_rewrite(tmp_path: Path) -> None:
    """The poll block (`--poll-only`) sits after the Slurm section's markers, so a full run's
    section leaves it, and its own rewrite replaces it in place; ratios are over the empty
    queue's."""
    from devtools.bench import slurm_bench

    out = tmp_path / "BENCHMARKS.md"
    write_section(out, "## Slurm\nold", slurm_bench.START, slurm_bench.END)
    for full_bytes in (3_000_000, 30_000_000):
        cost = slurm_bench.PollCost("22.05", 10_000, 3_000, 0.02, full_bytes, 2.0)
        block = slurm_bench.poll_section([cost])
        write_section(out, block, slurm_bench.POLL_START, slurm_bench.POLL_END)
        write_section(out, "## Slurm\nnew", slurm_bench.START, slurm_bench.END)
    text = out.read_text()
    assert text.count(slurm_bench.POLL_START) == 1 and "## Slurm\nnew" in text
    assert "| 22.05 | 3,000 B, 0.020 s | 30,000,000 B, 2.000 s | 10,000 | 100.0 |" in text
    assert text.index(slurm_bench.END) < text.index(slurm_bench.POLL_START)
