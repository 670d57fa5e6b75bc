"""Run a multi-process job on this machine, as the pods of one slice would run it:

    python -m tpu_jobs.launch --processes N [--devices-per-process D] [--grace-s S] -- ARGV...

starts N processes of ARGV with the layout variables `tpu_jobs.rcp.distributed` reads (the
coordinator on a free 127.0.0.1 port, the process count, each one's id), ``JAX_PLATFORMS=cpu``
and D CPU devices each (``XLA_FLAGS=--xla_force_host_platform_device_count=D``). SIGINT and
SIGTERM are passed on to every process. Exits 0 once all exit 0; otherwise with the code of the
first process that failed (128+signal for one killed by a signal), after the others have had
the grace period to exit on their own (then they are killed): a missing peer would otherwise
leave them waiting in a collective.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from types import FrameType

from rcpflow.trainer.job_exit import EXIT_BAD_ARGUMENTS
from tpu_jobs.rcp.distributed import COORDINATOR_ADDRESS_ENV, NUM_PROCESSES_ENV, PROCESS_ID_ENV

PROG = "python -m tpu_jobs.launch"
POLL_S = 0.05


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def process_env(
    base: dict[str, str], process_id: int, processes: int, port: int, devices: int
) -> dict[str, str]:
    """The environment of process `process_id` of `processes`."""
    flags = [f for f in base.get("XLA_FLAGS", "").split() if "device_count" not in f]
    return {
        **base,
        COORDINATOR_ADDRESS_ENV: f"127.0.0.1:{port}",
        NUM_PROCESSES_ENV: str(processes),
        PROCESS_ID_ENV: str(process_id),
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": " ".join([*flags, f"--xla_force_host_platform_device_count={devices}"]),
    }


def exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def supervise(procs: Sequence[subprocess.Popen[bytes]], grace_s: float) -> int:
    """Wait for every process; the first failure's code, the rest killed after `grace_s`."""
    failed: int | None = None
    deadline: float | None = None
    while True:
        codes = [p.poll() for p in procs]
        if failed is None:
            first = next((c for c in codes if c not in (None, 0)), None)
            if first is not None:
                failed, deadline = exit_code(first), time.monotonic() + grace_s
        if all(c is not None for c in codes):
            return 0 if failed is None else failed
        if deadline is not None and time.monotonic() > deadline:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for p in procs:
                p.wait()
            assert failed is not None
            return failed
        time.sleep(POLL_S)


MAX_PROCESSES = 1024  # a local launch of a few CPU processes; more is a typo
MAX_GRACE_S = 3600.0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, required=True, help="number of processes N")
    ap.add_argument(
        "--devices-per-process", type=int, default=1, help="CPU devices of each (default 1)"
    )
    ap.add_argument(
        "--grace-s",
        type=float,
        default=30.0,
        help="after a failure, how long the others get to exit, 0..3600 s (default %(default)s)",
    )
    ap.add_argument("argv", nargs=argparse.REMAINDER, help="-- the command of every process")
    args = ap.parse_args(argv)
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not command:
        ap.error("no command: give it after --")
    if args.processes < 1:
        ap.error(f"--processes must be >= 1, got {args.processes}")
    if args.devices_per_process < 1:
        ap.error(f"--devices-per-process must be >= 1, got {args.devices_per_process}")
    if args.processes > MAX_PROCESSES or args.devices_per_process > MAX_PROCESSES:
        ap.error(f"--processes and --devices-per-process must be <= {MAX_PROCESSES}")
    if not (math.isfinite(args.grace_s) and 0 <= args.grace_s <= MAX_GRACE_S):
        ap.error(f"--grace-s {args.grace_s} must be a number of seconds in [0, {MAX_GRACE_S:g}]")
    port = free_port()
    base = dict(os.environ)
    procs: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    try:
        for i in range(args.processes):
            env = process_env(base, i, args.processes, port, args.devices_per_process)
            procs.append(subprocess.Popen(command, env=env))
    except OSError as e:
        forward(signal.SIGTERM, None)
        print(f"{PROG}: error: cannot start {command[0]!r}: {e}", file=sys.stderr)
        return EXIT_BAD_ARGUMENTS
    return supervise(procs, args.grace_s)


if __name__ == "__main__":
    sys.exit(main())
