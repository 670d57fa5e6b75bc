"""BENCHMARKS.md is written by several benches (`make bench`: devtools.bench's
`checkpoint_bench`, `tunix_bench`, `verdict_bench` and `slurm_bench`), each owning sections
between its own markers (``<!-- name:start -->`` ... ``<!-- name:end -->``). `write_section`
is the one writer: it replaces a section in place and leaves everything outside its markers
byte for byte."""

from __future__ import annotations

from pathlib import Path


def write_section(
    path: str | Path,
    body: str,
    start: str,
    end: str,
    *,
    new_before: str | None = None,
    new_file: str = "# Benchmarks\n",
) -> None:
    """Put `body` between the markers `start` and `end` in the markdown file `path` (the markers
    are added; a `body` that already begins and ends with them is taken as it is). An earlier
    section between the same markers is replaced where it stands; a new one goes before the
    marker `new_before` when the file has it, else at the end. A missing file starts as
    `new_file`."""
    path = Path(path)
    body = body.strip("\n")
    if not body.startswith(start):
        body = f"{start}\n{body}"
    if not body.endswith(end):
        body = f"{body}\n{end}"
    block = body + "\n"
    text = path.read_text() if path.exists() else new_file
    if start in text and end in text.split(start, 1)[1]:
        head, rest = text.split(start, 1)
        tail = rest.split(end, 1)[1].lstrip("\n")
        text = head + block + ("\n" + tail if tail else "")
    elif new_before is not None and new_before in text:
        head, rest = text.split(new_before, 1)
        text = head + block + "\n" + new_before + rest
    else:
        text = text.rstrip("\n") + ("\n\n" if text.strip() else "") + block
    path.write_text(text)


SECTION_MARKER = "<!-- "


def write_head(path: str | Path, head: str) -> None:
    """Replace the head of the markdown file `path` (what comes before its first section
    marker: the file's title and the main bench's ratios) with `head`, keeping every marked
    section after it."""
    path = Path(path)
    text = path.read_text() if path.exists() else ""
    at = text.find(SECTION_MARKER)
    rest = "" if at < 0 else text[at:]
    path.write_text(head.rstrip("\n") + "\n" + ("\n" + rest if rest else ""))
