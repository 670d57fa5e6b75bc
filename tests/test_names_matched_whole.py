"""Every name pattern is matched whole (issue 29): `re.match` with `$` lets a trailing newline
pass, so the project uses `fullmatch` (a static check of every module), and the names that a
probe sent with a newline, `.` and `..` as Secret keys, and a credential in `[job_env]` are
refused naming the key."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tasks.backends import registry  # noqa: F401  (registers the [gke] table)
from tasks.deployment import DeploymentError, parse_deployment
from tasks.views.storage_index import NotUnderRoot, resolve_under

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rcpflow", "tasks", "tpu_jobs", "dags", "plugins")


def test_no_module_matches_a_name_by_its_start() -> None:
    """`x.match(...)` / `re.match(...)` anchor only the start; a name check wants fullmatch
    (`search` is for a part of a text)."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "match"
                ):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == [], f"use fullmatch (or search): {found}"


GKE_JOB = 'backend = "gke"\n[jobs.train]\ncommand = ["{python}", "-m", "tpu_jobs.train"]\n'


@pytest.mark.parametrize(
    ("toml", "named"),
    [
        ('[job_env]\n"A\\n" = "x"\n', "job_env.'A\\n'"),
        ('[job_env]\nHF_TOKEN = "x"\n', "job_env.HF_TOKEN: looks like a credential"),
        ('[job_env]\nMY_API_KEY = "x"\n', "job_env.MY_API_KEY: looks like a credential"),
        ('[job_env]\n"RCPFLOW_X\\n" = "x"\n', "job_env.'RCPFLOW_X\\n'"),
        (GKE_JOB + 'env = { "PATHX\\n" = "x" }\n', "env.'PATHX\\n'"),
        (GKE_JOB + 'secret_env = { "HF_TOKEN\\n" = { secret = "hf", key = "t" } }\n', "secret_env"),
        (GKE_JOB + 'secret_env = { HF_TOKEN = { secret = "hf\\n", key = "t" } }\n', "secret"),
        (GKE_JOB + 'secret_env = { HF_TOKEN = { secret = "hf", key = "t\\n" } }\n', "key"),
        (GKE_JOB + 'secret_env = { HF_TOKEN = { secret = "hf", key = "." } }\n', "key"),
        (GKE_JOB + 'secret_env = { HF_TOKEN = { secret = "hf", key = ".." } }\n', "key"),
        ('backend = "gke"\n[gke]\nnamespace = "ml\\n"\n', "gke.namespace"),
        ('backend = "gke"\n[gke.train]\ncpu_request = "4\\n"\n', "cpu_request"),
    ],
)
def test_a_name_with_a_trailing_newline_or_a_reserved_key_is_refused(
    tmp_path: Path, toml: str, named: str
) -> None:
    with pytest.raises(DeploymentError) as refused:
        parse_deployment(toml, source="d.toml", base_dir=tmp_path)
    assert named in str(refused.value), str(refused.value)


def test_a_secret_key_with_dots_inside_is_accepted(tmp_path: Path) -> None:
    toml = GKE_JOB + 'secret_env = { HF_TOKEN = { secret = "hf.x", key = ".token..b" } }\n'
    d = parse_deployment(toml, source="d.toml", base_dir=tmp_path)
    assert d.jobs.train.secret_env["HF_TOKEN"].key == ".token..b"


def test_the_views_names_are_matched_whole(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    with pytest.raises(NotUnderRoot):
        resolve_under(str(tmp_path), "a\n")
    assert resolve_under(str(tmp_path), "a") == str(tmp_path / "a")


def test_a_system_name_with_a_newline_is_refused() -> None:
    from rcpflow.submission import package

    assert package._NAME.fullmatch("sys\n") is None and package._NAME.fullmatch("sys-1.a")
