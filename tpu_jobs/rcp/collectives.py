"""The few host-level agreements the processes of one job make (process 0's decision reaches
every process; a flag any process raised reaches every process). One process: no collective."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils


def from_primary(values: Sequence[int]) -> list[int]:
    """Process 0's `values` on every process (the others pass placeholders of the same length)."""
    if jax.process_count() == 1:
        return list(values)
    got = multihost_utils.broadcast_one_to_all(np.asarray(values, np.int64))
    return [int(v) for v in got]


def any_process(flags: Sequence[bool]) -> list[bool]:
    """Per position: whether any process passed True there (every process gets the answer)."""
    if jax.process_count() == 1:
        return [bool(f) for f in flags]
    got = np.asarray(multihost_utils.process_allgather(np.asarray(flags, np.int32)))
    anywhere = np.asarray(got.reshape(jax.process_count(), -1).any(axis=0))
    return [bool(anywhere[i]) for i in range(len(flags))]
