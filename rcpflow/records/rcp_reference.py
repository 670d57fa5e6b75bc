"""The reference convergence points (RCPs) of the official 6.1.0 RCP file, per batch size.

The numbers are read from the file the RCP checker itself judges with
(``mlperf_logging/rcp_checker/training_6.1.0/rcps_qwen35_397b_grpo.json``), never copied: a
reference point is the mean of that batch size's "Epochs to converge" (for this benchmark they
are samples). A batch size between two listed ones gets the linear interpolation of their means,
as the checker builds its interpolated RCP; outside the listed range there is no reference.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from statistics import fmean

from rcpflow import recipe

RCP_FILE = f"training_{recipe.RULESET}/rcps_{recipe.BENCHMARK}.json"


class RcpFileError(RuntimeError):
    """The official RCP file is missing or not what the checker reads."""


@dataclass(frozen=True)
class ReferencePoint:
    """Where the reference runs of `global_batch_size` converged."""

    global_batch_size: int
    samples_to_converge: float
    interpolated: bool  # True: between two listed batch sizes, as the checker interpolates
    source: str  # the RCP file

    @property
    def step(self) -> float:
        return self.samples_to_converge / self.global_batch_size


def rcp_file() -> str:
    """Path of the official RCP file in the installed mlperf_logging (found, not imported)."""
    spec = importlib.util.find_spec("mlperf_logging")
    if spec is None or not spec.submodule_search_locations:
        raise RcpFileError("mlperf_logging is not installed: no official RCP file to read")
    root = next(iter(spec.submodule_search_locations))
    path = os.path.join(root, "rcp_checker", RCP_FILE)
    if not os.path.isfile(path):
        raise RcpFileError(f"{path}: the official RCP file is missing from mlperf_logging")
    return path


def reference_means(path: str | None = None) -> dict[int, float]:
    """Mean samples to converge by batch size, from the RCP file."""
    path = path or rcp_file()
    with open(path) as f:
        records = json.load(f)
    means: dict[int, float] = {}
    for name, record in records.items():
        try:
            bs, epochs = record["BS"], record["Epochs to converge"]
        except (TypeError, KeyError) as e:
            raise RcpFileError(f"{path}: record {name!r} lacks {e}") from e
        if record.get("Benchmark") != recipe.BENCHMARK or not epochs:
            raise RcpFileError(f"{path}: record {name!r} is not a {recipe.BENCHMARK} RCP")
        means[int(bs)] = fmean(float(e) for e in epochs)
    return dict(sorted(means.items()))


def reference_point(global_batch_size: int, path: str | None = None) -> ReferencePoint | None:
    """The reference convergence point for this batch size; None outside the listed range."""
    path = path or rcp_file()
    means = reference_means(path)
    if global_batch_size in means:
        return ReferencePoint(global_batch_size, means[global_batch_size], False, path)
    below = [bs for bs in means if bs < global_batch_size]
    above = [bs for bs in means if bs > global_batch_size]
    if not below or not above:
        return None
    lo, hi = max(below), min(above)
    fraction = (global_batch_size - lo) / (hi - lo)
    samples = means[lo] + fraction * (means[hi] - means[lo])
    return ReferencePoint(global_batch_size, samples, True, path)
