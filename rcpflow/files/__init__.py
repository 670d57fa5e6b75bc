"""Where a run's files live and how they are read and written: the run layout, storage (a local disk
or `gs://`, atomic writes), strict JSON, an MLLOG's text as the official parser reads it, running a
program with its output captured, which failures are the user's, a progress line on a terminal.
Imports nothing else of rcpflow but the recipe.
"""
