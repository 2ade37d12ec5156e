"""``hlo-guard`` / ``python -m hlo_guard``: explain, dump and compare from a shell.

    hlo-guard explain  mymodel.py:loss f32[4]
    hlo-guard dump     mymodel.py:loss f32[4] --level stablehlo --program grad
    hlo-guard compare  mymodel.py:loss "[-1,0,1,4]" --transform hessian --strict

Exit codes (stable, for scripts):

* ``0`` -- success (compare: the contract holds);
* ``1`` -- ``compare`` found a contract violation: a forward value changed, or a
  derivative lane that is finite without guards became NaN/inf or moved
  (relative difference above 1e-5) with them;
* ``2`` -- usage error: bad argument spec, unknown option, missing module, file
  or function (a one-line message on stderr, no traceback);
* ``3`` -- ``--strict`` and the result is not clean: ``compare`` still sees
  NaN/inf in a guarded derivative lane; ``explain`` lists unguarded sites;
* ``4`` -- the user's module or function (or JAX) raised an error while being
  imported, traced, compiled or run (message on stderr; ``--traceback`` shows it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

EXIT_OK, EXIT_VIOLATION, EXIT_USAGE, EXIT_STRICT, EXIT_ERROR = 0, 1, 2, 3, 4


class UsageError(Exception):
    pass


def _parser() -> argparse.ArgumentParser:
    from hlo_guard.argspec import FILLS, HELP
    from hlo_guard.inspect.compare import TRANSFORMS
    from hlo_guard.inspect.dumps import LEVELS, PROGRAMS, SHOWS

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "target",
        metavar="MODULE:FUNCTION",
        help="an importable module or a path to a .py file, and a function",
    )
    common.add_argument("specs", nargs="*", metavar="ARG", help=HELP)
    common.add_argument(
        "--fill",
        choices=FILLS,
        default="linspace",
        help="contents of shape specs (default: linspace over [-1, 1])",
    )
    common.add_argument(
        "--static-argnums",
        type=int,
        nargs="+",
        default=(),
        metavar="N",
        help="positional arguments passed as Python values",
    )
    common.add_argument("--x64", action="store_true", help="enable jax_enable_x64")
    common.add_argument("--json", action="store_true", help="print JSON instead of text")
    common.add_argument(
        "--traceback", action="store_true", help="show the traceback when the function raises"
    )

    parser = argparse.ArgumentParser(
        prog="hlo-guard",
        description="Show what hlo_guard does to a JAX function, or why its gradient is NaN.",
        epilog="exit codes: 0 ok, 1 compare found a contract violation, 2 usage error, "
        "3 --strict and not clean, 4 the function raised",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    p = sub.add_parser(
        "explain", parents=[common], help="guard sites and unguarded sites, with file:line"
    )
    p.add_argument("--strict", action="store_true", help="exit 3 if any site is unguarded")
    p = sub.add_parser(
        "dump",
        parents=[common],
        help="original/guarded jaxpr, StableHLO or optimized HLO, or a diff",
    )
    p.add_argument("--level", choices=LEVELS, default="jaxpr")
    p.add_argument("--program", choices=PROGRAMS, default="forward")
    p.add_argument(
        "--show",
        choices=SHOWS,
        default="diff",
        help="diff (default), guarded (guards marked), original, both",
    )
    p = sub.add_parser(
        "compare", parents=[common], help="plain vs guarded compiled values and derivatives"
    )
    p.add_argument("--transform", choices=TRANSFORMS, default="grad")
    p.add_argument(
        "--strict", action="store_true", help="exit 3 if a guarded derivative lane is still NaN/inf"
    )
    p = sub.add_parser(
        "diagnose",
        parents=[common],
        help="why the plain derivative is NaN: leak (which where, which op) or genuine",
    )
    p.add_argument(
        "--argnums", type=int, nargs="+", default=[0], metavar="N", help="arguments differentiated"
    )
    p.add_argument("--mode", choices=("reverse", "forward"), default="reverse")
    p.add_argument(
        "--strict", action="store_true", help="exit 3 if the plain derivative has a NaN/inf lane"
    )
    return parser


def _prepare(ns):
    """(function, args, kwargs) from the command line; UsageError on bad input."""
    from hlo_guard.argspec import SpecError, needs_x64, parse_arguments
    from hlo_guard.loader import TargetError, load_function

    try:
        static = tuple(ns.static_argnums)
        if ns.x64 or needs_x64(ns.specs):
            import jax

            jax.config.update("jax_enable_x64", True)
        args, kwargs = parse_arguments(ns.specs, ns.fill, static)
        fn = load_function(ns.target)
    except (SpecError, TargetError) as exc:
        raise UsageError(str(exc)) from None
    if static:
        from hlo_guard.api import guard

        fn = guard(fn, static_argnums=static)
    return fn, args, kwargs


def _run(ns) -> int:
    fn, args, kwargs = _prepare(ns)
    from hlo_guard.inspect.explain_tf import PlainTFFunctionError, is_tf_guarded, refuse_plain_tf

    if is_tf_guarded(fn):
        return _command(ns, fn, args, kwargs)
    try:
        with refuse_plain_tf(fn, args, kwargs):
            return _command(ns, fn, args, kwargs)
    except PlainTFFunctionError as exc:
        module, _, name = ns.target.rpartition(":")
        new_name = name.rpartition(".")[2] + "_guarded"
        raise UsageError(
            f"{ns.target} is {exc.kind}, not a JAX function; guard it in its module "
            f"(`{new_name} = hlo_guard.tf.guard({name})`) and run "
            f"`hlo-guard {ns.command} {module}:{new_name} ...`"
        ) from None


def _command(ns, fn, args, kwargs) -> int:
    if ns.command == "explain":
        from hlo_guard.inspect.explain import explain

        report = explain(fn, *args, **kwargs)
        print(report.to_json() if ns.json else report.to_text())
        return EXIT_STRICT if ns.strict and report.unguarded else EXIT_OK
    if ns.command == "dump":
        from hlo_guard.inspect.dumps import dump

        text = dump(fn, *args, level=ns.level, program=ns.program, show=ns.show, **kwargs)
        if ns.json:
            print(
                json.dumps(
                    {
                        "target": ns.target,
                        "level": ns.level,
                        "program": ns.program,
                        "show": ns.show,
                        "text": text,
                    },
                    indent=2,
                )
            )
        else:
            print(text)
        return EXIT_OK
    if ns.command == "diagnose":
        from hlo_guard.inspect.diagnose import diagnose

        if kwargs or ns.static_argnums:
            raise UsageError("diagnose takes positional array arguments only")
        argnums = ns.argnums[0] if len(ns.argnums) == 1 else tuple(ns.argnums)
        diagnosis = diagnose(fn, *args, argnums=argnums, mode=ns.mode)
        print(diagnosis.to_json() if ns.json else diagnosis.to_text())
        return EXIT_STRICT if ns.strict and not diagnosis.finite else EXIT_OK
    from hlo_guard.inspect.compare import compare

    result = compare(fn, *args, transform=ns.transform, **kwargs)
    print(result.to_json() if ns.json else result.to_text())
    if not result.ok():
        return EXIT_VIOLATION
    if ns.strict and result.guarded_nonfinite():
        return EXIT_STRICT
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    parser = _parser()
    ns = parser.parse_args(argv)  # exits 2 with a usage message on bad options
    from hlo_guard.errors import GuardUsageError

    try:
        return _run(ns)
    except UsageError as exc:
        print(f"hlo-guard: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except GuardUsageError as exc:
        print(f"hlo-guard: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `hlo-guard dump ... | head`: the reader left, not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except Exception as exc:  # the user's code (or JAX) failed: report it, no traceback
        if ns.traceback:
            traceback.print_exc()
        else:
            print(
                f"hlo-guard: {ns.target} failed: {type(exc).__name__}: {exc}\n"
                "(run with --traceback to see where)",
                file=sys.stderr,
            )
        return EXIT_ERROR


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
