"""The product's job reader (`tasks.backends.slurm.hooks.job_from_json`) on real job JSON of
both Slurm versions the harness runs (``fixtures/slurm-*.json``, written by
``python -m devtools.servers.slurm_capture``): squeue --json, scontrol --json (24.11 only)
and every slurmrestd API version each serves, for COMPLETED 0, FAILED 5, exit 143, killed by
SIGTERM, CANCELLED and held. Every source and version must read the same outcome."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tasks.backends.slurm.hooks import job_from_json

FIXTURES = Path(__file__).parent / "fixtures"
# case -> (state, exit code, signal): what the job did. A job killed by a signal has no exit
# code of its own (22.05's wait status says 0, 24.11 leaves return_code unset).
TRUTH: dict[str, tuple[str, int | None, int | None]] = {
    "completed_0": ("COMPLETED", 0, None),
    "failed_5": ("FAILED", 5, None),
    "exit_143": ("FAILED", 143, None),
    "killed_by_sigterm": ("FAILED", None, 15),
    "cancelled": ("CANCELLED", None, 15),
    "held": ("PENDING", None, None),
}


def _captured() -> list[Any]:
    params = []
    for path in sorted(FIXTURES.glob("slurm-*.json")):
        captured = json.loads(path.read_text())
        version = path.stem.removeprefix("slurm-")
        for source, jobs in sorted(captured["sources"].items()):
            for case, job in sorted(jobs.items()):
                job_id = captured["job_ids"][case]
                params.append(
                    pytest.param(source, case, job, job_id, id=f"{version}-{source}-{case}")
                )
    return params


def test_both_versions_were_captured() -> None:
    versions = {p.stem for p in FIXTURES.glob("slurm-*.json")}
    assert versions == {"slurm-22.05", "slurm-24.11"}
    for path in FIXTURES.glob("slurm-*.json"):
        sources = json.loads(path.read_text())["sources"]
        assert "squeue" in sources and any(s.startswith("rest-") for s in sources), path
        assert all(set(jobs) == set(TRUTH) for jobs in sources.values()), path


@pytest.mark.parametrize(("source", "case", "job", "job_id"), _captured())
def test_each_captured_job_reads_as_what_it_did(
    source: str, case: str, job: dict[str, Any], job_id: str
) -> None:
    info = job_from_json(job, "rest" if source.startswith("rest") else "squeue")
    state, code, sig = TRUTH[case]
    assert (info.job_id, info.name) == (job_id, f"rcpflow-{case}")
    assert info.state == state
    assert info.finished == (case != "held")
    if sig is None:
        assert (info.exit_code, info.signal or None) == (code, None)
    else:
        # Killed: the signal, and no exit code that could pass for the job's own.
        assert info.signal == sig and not info.exit_code
