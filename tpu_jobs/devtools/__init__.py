"""Developer tools: benchmarks and measurement scripts, not part of a submission."""
