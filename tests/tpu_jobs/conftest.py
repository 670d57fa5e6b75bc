"""Fixtures of the tpu_jobs tests: ``trainer`` parametrised over {toy, tunix} for a contract both
honour (the Tunix case is slow and needs the ``tunix`` extra), one finished run of it per module
(`finished`) and a copy of that run per test (`run`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_runs import NO_TUNIX, TOY, TUNIX, Trainer, copy_of, finish_run


@pytest.fixture(
    scope="module",
    params=[TOY, pytest.param(TUNIX, marks=[pytest.mark.slow, NO_TUNIX])],
    ids=lambda t: t.name,
)
def trainer(request: pytest.FixtureRequest) -> Trainer:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def finished(trainer: Trainer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One finished run of `trainer` (made once per module and trainer; never changed)."""
    return finish_run(trainer, tmp_path_factory.mktemp(f"finished_{trainer.name}") / "run")


@pytest.fixture
def run(finished: Path, tmp_path: Path) -> Path:
    """A copy of the finished run, for a test to break."""
    return copy_of(finished, tmp_path)
