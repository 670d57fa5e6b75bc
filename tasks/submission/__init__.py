"""The submission: its spec and Params, its tasks (runs, packaging, checkers), the report."""
