"""The control plane's binaries (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
kwok, the JobSet and Kueue controllers): built by ``tests/k8s/controlplane/build.sh`` into a
folder named by the hash of its pins, found in $RCPFLOW_K8S_BIN, ``../shared/k8s-bin/`` or
``.cache/k8s-bin/`` (``make k8s-bin``; docs/k8s-control-plane.md)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from devtools.k8s.errors import BinariesMissing, ControlPlaneError

ROOT = Path(__file__).resolve().parents[2]
CONTROLPLANE_DIR = ROOT / "tests" / "k8s" / "controlplane"
BUILD_SCRIPT = CONTROLPLANE_DIR / "build.sh"
SHARED_BIN = ROOT.parent / "shared" / "k8s-bin"
CACHE_BIN = ROOT / ".cache" / "k8s-bin"
BIN_ENV = "RCPFLOW_K8S_BIN"  # a folder of binaries to use instead (what build.sh makes)

KUBE_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
JOBSET_VERSIONS = ("v0.10.1", "v0.12.0")
# Only its config/components (CRD) is copied, for tests of the version gate: older than v0.10.
OLDER_JOBSET_CRD = "v0.9.1"
OLDEST_JOBSET = JOBSET_VERSIONS[0]
NEWEST_JOBSET = JOBSET_VERSIONS[-1]


def pins_hash() -> str:
    """The hash build.sh names its output folder by (its pins: go.mod/go.sum/main.go, itself)."""
    try:
        out = subprocess.run(
            ["bash", str(BUILD_SCRIPT), "--hash"],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        raise ControlPlaneError(f"{BUILD_SCRIPT} --hash failed: {exc}") from exc
    if len(out) != 16:
        raise ControlPlaneError(f"{BUILD_SCRIPT} --hash printed {out!r}, not a 16-digit hash")
    return out


def candidate_dirs(hash_: str | None = None) -> list[Path]:
    """Where binaries are looked for, in order: $RCPFLOW_K8S_BIN, ../shared/k8s-bin/<hash>,
    .cache/k8s-bin/<hash>."""
    found = [Path(os.environ[BIN_ENV])] if os.environ.get(BIN_ENV) else []
    h = hash_ or pins_hash()
    return [*found, SHARED_BIN / h, CACHE_BIN / h]


def find_binaries(hash_: str | None = None) -> Path | None:
    """The first complete folder of `candidate_dirs`, or None."""
    for folder in candidate_dirs(hash_):
        if (folder / "COMPLETE").is_file() and all((folder / b).is_file() for b in KUBE_BINARIES):
            return folder
    return None


def build_binaries(out_root: Path | None = None) -> Path:
    """Run build.sh (tens of minutes from a cold Go cache; its progress on stderr) and return
    the folder it built."""
    argv = ["bash", str(BUILD_SCRIPT)]
    if out_root is not None:
        argv += ["--out", str(out_root)]
    try:
        done = subprocess.run(argv, check=False, stdout=subprocess.PIPE, text=True)
    except OSError as exc:
        raise ControlPlaneError(f"cannot run {BUILD_SCRIPT}: {exc}") from exc
    if done.returncode != 0:
        raise ControlPlaneError(f"{BUILD_SCRIPT} failed (exit {done.returncode}); see its stderr")
    return Path(done.stdout.strip().splitlines()[-1])


def binaries(*, build: bool = False) -> Path:
    """The binaries folder: found (`find_binaries`), else built when `build` and Go is there,
    else `BinariesMissing` saying where they were looked for and how to build them."""
    hash_ = pins_hash()
    found = find_binaries(hash_)
    if found is not None:
        return found
    looked = ", ".join(str(p) for p in candidate_dirs(hash_))
    go = shutil.which("go") or next(
        (g for g in ("/usr/local/go/bin/go",) if Path(g).is_file()), None
    )
    if build and go is not None:
        return build_binaries()
    why = "no Go toolchain" if go is None else "not built"
    raise BinariesMissing(
        f"no Kubernetes control-plane binaries for pins {hash_} ({why}; looked in {looked}); "
        "build them with `make k8s-bin` (tests/k8s/controlplane/build.sh; about an hour from "
        "cold Go caches on 2 busy cores, 9 GB of caches) or put a build in "
        f"{SHARED_BIN}/{hash_} (build.sh --out {SHARED_BIN}); docs/k8s-control-plane.md"
    )
