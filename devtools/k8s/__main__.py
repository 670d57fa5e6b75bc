"""``python -m devtools.k8s``: a local Kubernetes control plane with JobSet and TPU v5p nodes
(kwok) for a person, until Ctrl-C (docs/k8s-control-plane.md)."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from collections.abc import Sequence

from devtools.k8s.binaries import JOBSET_VERSIONS, NEWEST_JOBSET, binaries
from devtools.k8s.control_plane import ControlPlane
from devtools.k8s.errors import ControlPlaneError


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.k8s",
        description="Start a local Kubernetes control plane with JobSet and TPU v5p nodes "
        "(kwok) until Ctrl-C.",
    )
    parser.add_argument("--jobset", default=NEWEST_JOBSET, choices=JOBSET_VERSIONS)
    parser.add_argument("--kueue", action="store_true", help="also start Kueue's controller")
    parser.add_argument(
        "--build", action="store_true", help="build the binaries when none are found (slow)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the working folder (logs)")
    args = parser.parse_args(argv)
    try:
        bin_dir = binaries(build=args.build)
    except ControlPlaneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    # Ctrl-C is KeyboardInterrupt even where the shell started us with SIGINT ignored (`&`).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    plane = ControlPlane(
        bin_dir, jobset_version=args.jobset, kueue=args.kueue, keep_workdir=args.keep
    )
    try:
        with plane:
            print(f"binaries: {bin_dir}")
            print(f"API server: {plane.url}")
            for name, pid in plane.pids().items():
                print(f"  {name}: pid {pid}, log {plane.logs / (name + '.log')}")
            print(f"kubeconfig: {plane.kubeconfig}")
            print(f"export KUBECONFIG={plane.kubeconfig}")
            print("Ctrl-C stops everything.", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                while not stop.wait(1.0):
                    dead = [c.name for c in plane.components.values() if not c.running()]
                    if dead:
                        print(f"error: {', '.join(dead)} exited; stopping", file=sys.stderr)
                        return 1
    except ControlPlaneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # during the start: what was started is stopped already
        print("interrupted; stopped", file=sys.stderr)
        return 130
    print("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
