"""The benches of `make bench`: each measures in one run and writes its own BENCHMARKS.md
section (through rcpflow.files.markdown_sections)."""
