"""The `rcpflow` command line. Exit codes are part of the contract (see each command's help)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from rcpflow.recipe import DIVISIONS

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_USAGE = 2
EXIT_INCOMPLETE = 3


def _val_start(args: argparse.Namespace) -> int:
    from rcpflow.recipe import GENERATIONS_PER_PROMPT, val_start_at

    gbs, override = args.global_batch_size, args.override
    if gbs <= 0 or (override is not None and override < 0):
        print("invalid: --global-batch-size must be positive and --override >= 0", file=sys.stderr)
        return EXIT_INVALID
    if gbs % GENERATIONS_PER_PROMPT:
        # The formula is defined for any batch, but no valid run has this one: say so.
        print(
            f"warning: global_batch_size {gbs} is not a multiple of {GENERATIONS_PER_PROMPT} "
            "(prompts x generations); the closed division rejects it",
            file=sys.stderr,
        )
    print(val_start_at(gbs, override))
    return EXIT_OK


def _manifest_validate(args: argparse.Namespace) -> int:
    from rcpflow.manifest import ManifestError, load

    try:
        m = load(args.manifest, mllog_path=args.mllog)
    except ManifestError as e:
        print(f"invalid: {e}", file=sys.stderr)
        return EXIT_INVALID
    for w in m.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if m.rows:
        first, last = m.rows[0], m.rows[-1]
        print(
            f"valid: {len(m.rows)} rows, steps {first.step}..{last.step} of max_steps "
            f"{last.max_steps}, global_batch_size {first.global_batch_size}, seed {first.seed}, "
            f"{len(m.stale_steps)} stale dropped"
        )
    else:
        print(f"valid: 0 rows, {len(m.stale_steps)} stale dropped")
    return EXIT_OK


def _finalize(args: argparse.Namespace) -> int:
    from rcpflow.finalize import FinalizeInputError, finalize

    try:
        result = finalize(args.run_dir)
    except FinalizeInputError as e:
        print(f"invalid: {e}", file=sys.stderr)
        return EXIT_INVALID
    for w in result.warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(f"{result.status}: {result.reason} ({result.log_path})")
    print(json.dumps(result.verdict()))
    return EXIT_INCOMPLETE if result.status == "incomplete" else EXIT_OK


def _check(args: argparse.Namespace) -> int:
    import contextlib
    import tempfile

    from rcpflow.checkers import compliance
    from rcpflow.mllog import MLLogError, read_events
    from rcpflow.storage import storage_for

    if not storage_for(args.log).exists(args.log):
        print(f"invalid: {args.log!r}: no such MLLOG", file=sys.stderr)
        return EXIT_INVALID
    division = args.division
    if division is None:  # the rules the log itself asks to be judged by
        try:
            declared = [e.value for e in read_events(args.log) if e.key == "submission_division"]
        except MLLogError as e:
            print(f"invalid: {e}", file=sys.stderr)
            return EXIT_INVALID
        division = declared[0] if declared and declared[0] in DIVISIONS else "closed"
    with contextlib.ExitStack() as stack:  # without --log-dir, nothing is left behind
        log_dir = args.log_dir or stack.enter_context(
            tempfile.TemporaryDirectory(prefix="rcpflow-check-")
        )
        result = compliance(args.log, division=division, log_dir=log_dir)
    kept = result.log_file if args.log_dir else "not kept (pass --log-dir to keep it)"
    for line in result.errors:
        print(line, file=sys.stderr)
    print(
        f"{'PASSED' if result.ok else 'FAILED'}: compliance checker ({division}, ruleset "
        f"6.1.0) on {args.log}; its log: {kept}"
    )
    return EXIT_OK if result.ok else EXIT_INVALID


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rcpflow", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    v = sub.add_parser("val-start", help="print the validation start step (last line)")
    v.add_argument("--global-batch-size", type=int, required=True)
    v.add_argument("--override", type=int, default=None, help="explicit start step (> 0 wins)")
    v.set_defaults(func=_val_start)

    m = sub.add_parser("manifest", help="manifest commands")
    msub = m.add_subparsers(dest="manifest_command", required=True)
    mv = msub.add_parser("validate", help="exit 0 valid, 1 invalid (names the step or line)")
    mv.add_argument("manifest")
    mv.add_argument("--mllog", default=None, help="MLLOG for the stale-row check")
    mv.set_defaults(func=_manifest_validate)

    f = sub.add_parser(
        "finalize",
        help="write the eval section; exit 0 success/aborted, "
        "3 incomplete, 1 invalid input (log untouched)",
    )
    f.add_argument("run_dir")
    f.set_defaults(func=_finalize)

    c = sub.add_parser("check", help="official compliance checker verdict, exit 0/1")
    c.add_argument("log")
    c.add_argument(
        "--division",
        choices=DIVISIONS,
        default=None,
        help="rules to apply (default: the division the log declares, else closed)",
    )
    c.add_argument("--log-dir", default=None, help="where the checker's own log goes")
    c.set_defaults(func=_check)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from rcpflow.usererrors import USER_ERRORS, describe

    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except USER_ERRORS as e:  # bad input the command did not name itself: still one line
        print(f"invalid: {describe(e)}", file=sys.stderr)
        return EXIT_INVALID


if __name__ == "__main__":
    sys.exit(main())
