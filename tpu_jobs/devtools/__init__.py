"""Developer tools (benchmarks), not runtime code: no job imports them; images leave them out."""
