"""The `rcpflow` command line. Exit codes are part of the contract (see each command's help).

Every command tells a problem in one line on stderr, with one prefix for its kind: ``invalid:``
(bad input: the path, what is wrong with it, what to give instead; exit 1), ``error:`` (a
failure that is not the input's: a path that cannot be read, storage without credentials;
exit 1) and ``usage error:`` (flags; exit 2). docs/exit-codes.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NoReturn

from rcpflow.cli.path_hints import log_problem, manifest_problem, run_dir_problem
from rcpflow.recipe import DIVISIONS
from rcpflow.verdict.eval_import import RESULT_FORMATS, RESULT_TREE
from rcpflow.verdict.schedule import SCHEDULES

if TYPE_CHECKING:
    from rcpflow.retention.rule import RetentionPolicy

# The exit codes of the rcpflow CLI (docs/exit-codes.md, "The `rcpflow` CLI"): not the job
# contract of rcpflow.trainer.job_exit, hence their own prefix.
CLI_OK = 0
CLI_INVALID = 1
CLI_USAGE = 2
CLI_INCOMPLETE = 3


def _int64(text: str) -> int:
    """An argparse type: a decimal integer within 64 bits (a bigger one is a usage error), as
    written: no spaces and no ``_`` (which Python's int would take)."""
    try:
        if not text or any(c.isspace() or c == "_" for c in text):
            raise ValueError
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if not -(2**63) <= value < 2**63:
        raise argparse.ArgumentTypeError(f"{text} is out of the 64-bit range")
    return value


def _count(text: str) -> int:
    """An argparse type: `_int64`, 0 or more."""
    value = _int64(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative: give 0 or more")
    return value


# Which argument of a command is a path of which kind, and what to say when it is not one.
PathCheck = tuple[str, Callable[[str], "str | None"]]
_RUN_DIR: PathCheck = ("run_dir", run_dir_problem)


class _Parser(argparse.ArgumentParser):
    """argparse with rcpflow's one style: ``usage error: <what> (see <command> --help)``, exit 2
    (after argparse's usage line)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(CLI_USAGE, f"usage error: {message} (see {self.prog} --help)\n")


def _invalid(what: object) -> int:
    """Bad input: one line ``invalid: <what>`` on stderr, exit 1."""
    print(f"invalid: {what}", file=sys.stderr)
    return CLI_INVALID


def _error(what: object) -> int:
    """A failure that is not the input's: one line ``error: <what>`` on stderr, exit 1."""
    print(f"error: {what}", file=sys.stderr)
    return CLI_INVALID


def _val_start(args: argparse.Namespace) -> int:
    """print the validation start step (last line)"""
    from rcpflow.recipe import GENERATIONS_PER_PROMPT, val_start_at

    gbs, override = args.global_batch_size, args.override
    if gbs <= 0 or (override is not None and override < 0):
        return _invalid("--global-batch-size must be positive and --override >= 0")
    if gbs % GENERATIONS_PER_PROMPT:
        # The formula is defined for any batch, but no valid run has this one: say so.
        print(
            f"warning: global_batch_size {gbs} is not a multiple of {GENERATIONS_PER_PROMPT} "
            "(prompts x generations); the closed division rejects it",
            file=sys.stderr,
        )
    print(val_start_at(gbs, override))
    return CLI_OK


def _manifest_validate(args: argparse.Namespace) -> int:
    """exit 0 valid, 1 invalid (names the step or line, or a row's MLLOG that is missing)"""
    from rcpflow.files.storage import storage_for
    from rcpflow.records.manifest import load

    m = load(args.manifest, mllog_path=args.mllog)
    for r in {r.mllog_file: r for r in reversed(m.rows)}.values():
        if not storage_for(r.mllog_file).exists(r.mllog_file):  # finalize would fail on it
            return _invalid(f"step {r.step}: mllog_file {r.mllog_file} does not exist")
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
    return CLI_OK


def _manifest_add(args: argparse.Namespace) -> int:
    """record a committed checkpoint (trainers that are not Python); the run's fields come from its
    MLLOG; exit 0 added or identical, 1 refused (names the step and why)"""
    from rcpflow.trainer.manifest_add import add_row
    from rcpflow.trainer.ownership import RunOwnedError, owner_from_env
    from rcpflow.trainer.recorder import RecorderError

    try:
        row, added = add_row(
            args.run_dir,
            args.step,
            args.checkpoint,
            args.timestamp_ms,
            seed=args.seed,
            val_start_at=args.val_start_at,
            weights_fingerprint=args.weights_fingerprint,
            owner=args.owner if args.owner is not None else owner_from_env(),
        )
    except (RecorderError, RunOwnedError) as e:
        return _invalid(e)
    what = "added" if added else "already there (identical)"
    print(f"step {row.step}: row {what}: {row.checkpoint_path} at {row.timestamp_ms}")
    return CLI_OK


def _manifest_import(args: argparse.Namespace) -> int:
    """the manifest from a foreign trainer's own checkpoint tree (NeMo-RL's step_<N>/
    training_info.json), each checkpoint verified; exit 0 imported (or nothing new), 1 refused
    (names the step, file and field; nothing written)"""
    from rcpflow.trainer.nemo_rl_import import import_checkpoint_tree

    result = import_checkpoint_tree(
        args.run_dir,
        args.root,
        seed=args.seed,
        val_start_at=args.val_start_at,
        eval_schedule=args.eval_schedule,
    )
    print(result.describe())
    return CLI_OK


def _run_reset(args: argparse.Namespace) -> int:
    """move the run's MLLOG, manifest and stop request aside (previous/reset-<time>/) so a trainer
    may start it afresh; exit 0 moved, 1 refused (owned, or nothing to move)"""
    from rcpflow.trainer.run_reset import reset_run

    folder, moved = reset_run(args.run_dir)
    for path in moved:
        print(f"moved aside: {path}")
    print(f"reset: {args.run_dir} may be trained afresh; the old run is in {folder}")
    return CLI_OK


def _lease(args: argparse.Namespace) -> int:
    """the run folder's lease for a trainer that is not Python: hold takes it (live while its
    heartbeat is fresh: renew well within RCPFLOW_LEASE_TIMEOUT_S), renew beats it, release
    frees it; exit 0 done, 1 refused (another live holder, or not yours: stop writing)"""
    from rcpflow.trainer import ownership

    owner = args.owner if args.owner is not None else ownership.owner_from_env()
    if owner is None or not owner.strip() or len(owner) > 1000 or not owner.isprintable():
        return _usage(args, "--owner: give this trainer's identity (or $RCPFLOW_RUN_OWNER)")
    try:
        if args.action == "hold":
            said = ownership.hold(args.run_dir, owner, ownership.timeout_from_env())
            print(f"held by {owner}{f': {said}' if said else ''}")
        elif args.action == "renew":
            ownership.renew(args.run_dir, owner)
            print(f"renewed by {owner}")
        else:
            released = ownership.release_owned(args.run_dir, owner)
            print(f"released by {owner}" if released else "no lease: nothing to release")
    except ownership.RunOwnedError as e:
        return _invalid(e)
    return CLI_OK


def _status(args: argparse.Namespace) -> int:
    """per checkpoint: summary, gate decision, and what finalize would write now; exit 0, 1 when the
    manifest cannot be read"""
    from rcpflow.cli.status import manifest_problem, render_table, run_status

    status = run_status(args.run_dir)
    print(status.to_json() if args.json else render_table(status), end="")
    problem = manifest_problem(status)
    if problem is None:
        return CLI_OK
    return CLI_INVALID if args.json else _invalid(problem)  # JSON names it as manifest_error


def _finalize(args: argparse.Namespace) -> int:
    """write the eval section; exit 0 success/aborted, 3 incomplete, 1 invalid input (log
    untouched)"""
    from rcpflow.verdict.finalize import finalize

    result = finalize(args.run_dir)
    for w in result.warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(f"{result.status}: {result.reason} ({result.log_path})")
    print(json.dumps(result.verdict()))
    return CLI_INCOMPLETE if result.status == "incomplete" else CLI_OK


def _check(args: argparse.Namespace) -> int:
    """official compliance checker verdict, exit 0/1"""
    import contextlib
    import tempfile

    from rcpflow.files.storage import storage_for
    from rcpflow.records.mllog import read_events
    from rcpflow.submission.checkers import compliance

    if not storage_for(args.log).exists(args.log):
        return _invalid(f"{args.log!r}: no such MLLOG")
    division = args.division
    if division is None:  # the rules the log itself asks to be judged by
        declared = [e.value for e in read_events(args.log) if e.key == "submission_division"]
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
    return CLI_OK if result.ok else CLI_INVALID


def _usage(args: argparse.Namespace, message: str) -> int:
    """Flags that do not go together: ``usage error: <what> (see <command> --help)``, exit 2."""
    print(f"usage error: {message} (see {args.prog} --help)", file=sys.stderr)
    return CLI_USAGE


def _eval_import(args: argparse.Namespace) -> int:
    """verify another evaluator's result and write eval/step_N/summary.json; exit 0 imported, 1
    invalid (names the file, field or line; nothing written), 2 usage"""
    from rcpflow.verdict.eval_import import import_eval, import_results_tree

    times = (args.eval_start_ms, args.eval_stop_ms)
    if (times[0] is None) != (times[1] is None):
        return _usage(args, "--eval-start-ms and --eval-stop-ms go together")
    if args.eval_times_from is not None and times[0] is not None:
        return _usage(args, "--eval-times-from or --eval-start-ms/--eval-stop-ms, not both")
    if args.from_tree is not None:
        if args.source is not None or args.step is not None or args.format or times[0] is not None:
            return _usage(args, "--from-tree takes no SOURCE, --step, --format or eval times")
        from rcpflow.files.terminal_progress import Progress

        with Progress("importing", 0) as progress:  # the tree's step count, once listed
            result = import_results_tree(
                args.run_dir,
                args.from_tree,
                progress,
                eval_times_from=args.eval_times_from,
                reopen=args.reopen,
            )
        for step in result.steps:
            print(step.describe())
        for skipped in result.skipped:
            print(f"warning: {skipped}", file=sys.stderr)
        if not result.steps:
            return _invalid(f"{args.from_tree}: no step_<N>/<attempt>/summary.json")
        return CLI_OK if result.all_imported else CLI_INVALID
    if args.source is None or args.step is None:
        return _usage(args, "give --step N SOURCE, or --from-tree DIR")
    if args.since is not None:
        if args.attempts or args.reopen or times[0] is not None or args.eval_times_from:
            return _usage(args, "--since takes no --attempts, --reopen or eval times")
        if args.format is None:
            return _usage(args, "--since needs the result's --format")
        return _import_since(args)
    if args.format == RESULT_TREE:
        return _usage(args, f"--format {RESULT_TREE} goes with --since")
    imported = import_eval(
        args.run_dir,
        args.step,
        args.source,
        eval_times=None if times[0] is None else (times[0], times[1]),
        fmt=args.format,
        attempts=args.attempts,
        eval_times_from=args.eval_times_from,
        reopen=args.reopen,
    )
    print(imported.describe())
    return CLI_OK


def _eval_start(args: argparse.Namespace) -> int:
    """record an evaluate job's start for `eval import --since`: print the wall clock and what
    is at its result SOURCE already (one JSON line); exit 0, 1 unreadable"""
    from rcpflow.verdict.eval_import import result_baseline

    try:
        before = result_baseline(args.format, args.source, args.step)
    except OSError as e:
        return _invalid(f"{args.source}: {e}")
    print(json.dumps({"ms": _now_ms(), "baseline": before.to_dict()}, sort_keys=True))
    return CLI_OK


def _import_since(args: argparse.Namespace) -> int:
    """`eval import --since`: what the job left at SOURCE since `eval start`, with the eval
    times from that start to now (`import_new_result`, the rule the evaluate step runs)."""
    from rcpflow.files import jsonio
    from rcpflow.verdict.eval_import import Baseline, EvalImportError, import_new_result

    # Refusals are ValueErrors: `main` prints them as one `invalid:` line, exit 1.
    started = jsonio.loads(args.since, "--since")
    if not (isinstance(started, dict) and set(started) == {"ms", "baseline"}):
        raise EvalImportError(f"--since: not what `rcpflow eval start` prints: {started!r}")
    start, now = started["ms"], _now_ms()
    if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start <= now:
        raise EvalImportError(
            f"--since: ms must be a past time in ms since the epoch, got {start!r}"
        )
    before = Baseline.from_dict(started["baseline"])
    imported = import_new_result(
        args.run_dir, args.step, args.format, args.source, before, (start, now)
    )
    print(imported.describe())
    return CLI_OK


def _now_ms() -> int:
    import time

    return time.time_ns() // 1_000_000


def _command(
    sub: argparse._SubParsersAction[_Parser],
    name: str,
    func: Callable[[argparse.Namespace], int],
    path: PathCheck | None = None,
) -> argparse.ArgumentParser:
    """A subcommand that runs `func`, whose docstring is its help; `path` names its leading
    positional argument, a path of a kind (a run folder, a manifest, an MLLOG), checked first."""
    parser = sub.add_parser(name, help=func.__doc__)
    if path is not None:
        parser.add_argument(path[0])
    parser.set_defaults(func=func, path_check=path, prog=parser.prog)
    return parser


def _forecast(args: argparse.Namespace) -> int:
    """time to verdict, chip-hours and wasted evaluations of a run, simulated with the run DAG's
    rules; exit 0, 2 usage (names the flag)"""
    from rcpflow.cli.forecast import render_text, report, request_from
    from rcpflow.planning.forecast import ForecastUsageError

    try:
        request = request_from(args)
    except ForecastUsageError as e:
        return _usage(args, str(e))
    data = report(request)
    print(
        json.dumps(data, indent=2) if args.json else render_text(request, data, args.each), end=""
    )
    return CLI_OK


def _policy(args: argparse.Namespace) -> RetentionPolicy:
    from rcpflow.retention.rule import RetentionPolicy

    return RetentionPolicy(args.keep, args.last_k, args.while_training)


def _size(n: int) -> str:
    return f"{n / 1e9:.3f} GB" if n >= 10**8 else f"{n} B"


def _retention_plan(args: argparse.Namespace) -> int:
    """what retention would delete now (with sizes) and why each kept checkpoint is kept; deletes
    nothing; exit 0, 1 when the run folder cannot be planned"""
    from rcpflow.retention.apply import plan_run

    planned = plan_run(args.run_dir, _policy(args), args.settled, args.tree)
    total = 0
    for p in planned:
        d = p.decision
        what = f"step {d.step}" + (" train_state" if d.part == "train_state" else "")
        if d.goes:
            total += p.bytes
            print(f"{what}: goes ({d.reason}): {p.files} files, {_size(p.bytes)} {d.path}")
        else:
            print(f"{what}: kept ({d.reason})")
    print(f"would delete {_size(total)}")
    return CLI_OK


def _retention_apply(args: argparse.Namespace) -> int:
    """delete what retention plans (or finish an interrupted apply), recording it in the run
    folder's retention.json; safe to rerun; one apply per run folder at a time; exit 0, 1 when
    the run folder cannot be planned or another apply holds it"""
    from rcpflow.retention.apply import apply_run
    from rcpflow.retention.lock import RetentionBusy

    try:
        applied = apply_run(args.run_dir, _policy(args), args.settled, args.tree)
    except RetentionBusy as e:
        return _error(e)
    for part in applied["parts"]:  # type: ignore[attr-defined]
        if part["goes"]:
            print(f"step {part['step']} {part['part']}: {part['outcome']} ({part['reason']})")
    return CLI_OK


def _retention_arguments(parser: argparse.ArgumentParser) -> None:
    from rcpflow.retention.rule import KEEPS

    parser.add_argument(
        "--keep", choices=KEEPS, default="passing", help="which evaluated checkpoints stay"
    )
    parser.add_argument(
        "--last-k", type=_count, default=1, help="with --keep last-k: how many evaluated stay"
    )
    parser.add_argument(
        "--while-training",
        action="store_true",
        help="delete before training has ended (only for a trainer whose resume tolerates it; "
        "rcpflow's does not)",
    )
    parser.add_argument(
        "--settled",
        action="store_true",
        help="no evaluation of the run is running or will start: checkpoints above the passing "
        "step without a summary may go too",
    )
    parser.add_argument(
        "--tree",
        action="append",
        default=[],
        metavar="DIR",
        help="a foreign trainer's checkpoint tree (NeMo-RL's, Tunix's) that retention may delete "
        "from besides RUN_DIR/checkpoints (repeatable); what goes is decided from the run's "
        "manifest and verified summaries only",
    )


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="rcpflow", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command", required=True)

    v = _command(sub, "val-start", _val_start)
    v.add_argument("--global-batch-size", type=_int64, required=True)
    v.add_argument("--override", type=_int64, default=None, help="explicit start step (> 0 wins)")

    m = sub.add_parser("manifest", help="manifest commands")
    msub = m.add_subparsers(dest="manifest_command", required=True)
    mv = _command(msub, "validate", _manifest_validate, path=("manifest", manifest_problem))
    mv.add_argument("--mllog", default=None, help="MLLOG for the stale-row check")
    ma = _command(msub, "add", _manifest_add, path=_RUN_DIR)
    ma.add_argument("--step", type=_int64, required=True)
    ma.add_argument("--checkpoint", required=True, help="the committed checkpoint (must exist)")
    ma.add_argument("--timestamp-ms", type=_int64, required=True, help="its weight-update time")
    ma.add_argument("--seed", type=_int64, help="picks mllog/seed_<n>.out (default: the only one)")
    ma.add_argument("--val-start-at", type=_int64, help="default: the rows', else the recipe's")
    ma.add_argument("--weights-fingerprint")
    ma.add_argument(
        "--owner",
        help="the trainer's identity for the run folder's lease (default $RCPFLOW_RUN_OWNER); "
        "without one the add only checks that no other trainer owns the folder",
    )

    le = _command(sub, "lease", _lease)
    le.add_argument("action", choices=("hold", "renew", "release"))
    le.add_argument("run_dir")
    le.add_argument(
        "--owner",
        help="the trainer's identity (default $RCPFLOW_RUN_OWNER); the same for every call",
    )
    mi = _command(msub, "import", _manifest_import, path=_RUN_DIR)
    mi.add_argument("root", metavar="CHECKPOINT_ROOT", help="the trainer's checkpoint tree")
    mi.add_argument("--format", choices=("nemo-rl",), required=True)
    mi.add_argument("--seed", type=_int64, help="picks mllog/seed_<n>.out (default: the only one)")
    mi.add_argument("--val-start-at", type=_int64, help="default: the rows', else the recipe's")
    mi.add_argument(
        "--eval-schedule",
        choices=SCHEDULES,
        help="after_training: refuse a config whose keep_top_k deletes checkpoints before then",
    )

    r = sub.add_parser("run", help="run folder commands")
    rsub = r.add_subparsers(dest="run_command", required=True)
    _command(rsub, "reset", _run_reset, path=_RUN_DIR)

    e = sub.add_parser("eval", help="evaluation results")
    esub = e.add_subparsers(dest="eval_command", required=True)
    ei = _command(esub, "import", _eval_import, path=_RUN_DIR)
    ei.add_argument("source", nargs="?", help="summary.json or attempt records (local or gs://)")
    ei.add_argument("--step", type=_int64, help="the manifest row the result belongs to")
    ei.add_argument("--eval-start-ms", type=_int64, help="eval wall clock (else from the source)")
    ei.add_argument("--eval-stop-ms", type=_int64)
    ei.add_argument(
        "--eval-times-from",
        metavar="LOG",
        help="the evaluating pipeline's MLLOG: eval times from its eval_start/eval_stop of the "
        "row's samples_count (Tunix's summaries carry none)",
    )
    ei.add_argument(
        "--format",
        choices=RESULT_FORMATS,
        help=f"default: detected ({RESULT_TREE}: SOURCE is such a tree, with --since)",
    )
    ei.add_argument("--attempts", help="attempt records beside a summary (default: its attempts/)")
    ei.add_argument(
        "--reopen",
        action="store_true",
        help="replace a summary that a written run_stop depends on (the next finalize rewrites "
        "the eval section)",
    )
    ei.add_argument(
        "--from-tree",
        metavar="DIR",
        help="import every step of DIR/step_<N>/<stamp>-<id>/summary.json (newest valid one)",
    )
    ei.add_argument(
        "--since",
        metavar="JSON",
        help="what `rcpflow eval start` printed before the evaluate job: import only what the "
        "job left at SOURCE since, with the eval times from that start to now",
    )
    es = _command(esub, "start", _eval_start, path=_RUN_DIR)
    es.add_argument("source", help="the evaluate job's result (a file, or a --format tunix-tree)")
    es.add_argument("--step", type=_int64, required=True, help="the manifest row it evaluates")
    es.add_argument("--format", choices=RESULT_FORMATS, required=True)

    _command(sub, "finalize", _finalize, path=_RUN_DIR)

    rt = sub.add_parser("retention", help="delete the checkpoints no verdict needs any more")
    rtsub = rt.add_subparsers(dest="retention_command", required=True)
    _retention_arguments(_command(rtsub, "plan", _retention_plan, path=_RUN_DIR))
    _retention_arguments(_command(rtsub, "apply", _retention_apply, path=_RUN_DIR))

    st = _command(sub, "status", _status, path=_RUN_DIR)
    st.add_argument("--json", action="store_true", help="the same data as JSON")

    c = _command(sub, "check", _check, path=("log", log_problem))
    c.add_argument(
        "--division",
        choices=DIVISIONS,
        default=None,
        help="rules to apply (default: the division the log declares, else closed)",
    )
    c.add_argument("--log-dir", default=None, help="where the checker's own log goes")

    from rcpflow.cli.forecast import add_arguments

    fc = _command(sub, "forecast", _forecast)
    add_arguments(fc)
    return p


# Errors that are the input's (a value, a path that is missing or of the wrong kind); the rest
# of USER_ERRORS (unreadable, unreachable) are failures.
_INPUT_ERRORS = (
    ValueError,
    FileNotFoundError,
    FileExistsError,
    IsADirectoryError,
    NotADirectoryError,
)


def main(argv: Sequence[str] | None = None) -> int:
    from rcpflow.files.usererrors import USER_ERRORS, describe

    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # argparse fills positionals from the first run of them, so in `eval import RUN_DIR --step N
    # SOURCE` the SOURCE after the option comes back unparsed: it is the source.
    importing = args.command == "eval" and args.eval_command == "import"
    if importing and args.source is None and len(extra) == 1 and not extra[0].startswith("-"):
        args.source, extra = extra[0], []
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.path_check is not None:
        name, problem_of = args.path_check
        problem = problem_of(getattr(args, name))
        if problem is not None:
            return _invalid(problem)
    try:
        return int(args.func(args))
    except _INPUT_ERRORS as e:  # rcpflow's refusals are ValueErrors naming what is wrong
        return _invalid(describe(e))
    except USER_ERRORS as e:  # a path that cannot be read, storage that cannot be reached
        return _error(describe(e))


if __name__ == "__main__":
    sys.exit(main())
