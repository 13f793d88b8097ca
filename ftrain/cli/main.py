"""The `ftrain` command line: a thin shell over `ftrain.service.RunService` (its commands and queries).

Exit codes: the table in `ftrain.errors` (0 success; 1 refused on the merits or not found; 2 usage or bad
input; 3 a server's `status`: not running; 128+N stopped by signal N). Errors are one line on stderr and
nothing is written.

Each command module adds its own commands to the parser (`add_parser`) and names the function that runs
each one. Start-up is kept to what the command needs: the parser is built from the standard library, the
schema's bounds and the error classes only; a command imports its work when it runs (`ftrain status` never
loads the supervisor, `--help` never loads the log's client).
"""

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from ftrain.cli import (
    completion,
    demo_cmd,
    events_cmd,
    export_cmd,
    keys_cmd,
    launch_cmd,
    metrics_cmd,
    query_cmd,
    record_cmd,
    server_cmd,
    storage_cmd,
    ui_cmd,
)
from ftrain.cli.arguments import Parser
from ftrain.console.visible_text import visible
from ftrain.errors import EXIT_CODES

CLOSED_PIPE = 141
"""128 + SIGPIPE: what a shell reports for `git log | head`'s git."""

COMMAND_MODULES = (
    launch_cmd, record_cmd, query_cmd, events_cmd, server_cmd, storage_cmd, keys_cmd, metrics_cmd, export_cmd,
    ui_cmd, demo_cmd, completion,
)  # fmt: skip
"""Each adds its commands with `add_parser(subparsers)`, in the order `--help` lists them, each command with
its `entry` (the function that runs it, loading what it needs then)."""


class _Version(argparse.Action):
    """`--version`: the installed package's version (pyproject.toml holds it), read only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from importlib.metadata import version

        from ftrain.console.output import emit

        emit(f"ftrain {version('ftrain')}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The whole command tree."""
    codes = "\n".join(f"  {code:<4} {meaning}" for code, meaning in EXIT_CODES)
    parser = Parser(
        prog="ftrain",
        description="Fault-tolerant distributed training: launch, checkpoint, resume.",
        epilog="examples:\n  $ ftrain run P --nodes 1 --gpus-per-node 8 -- train.py\n  $ ftrain list\n\n"
        f"exit codes:\n{codes}",
    )
    parser.add_argument("--version", action=_Version, help="print ftrain's version and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for module in COMMAND_MODULES:
        module.add_parser(sub)
    return parser


def _split_train_cmd(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    args = list(argv)
    if "--" in args:
        cut = args.index("--")
        return args[:cut], args[cut + 1 :]
    return args, []


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `ftrain` console script."""
    from ftrain.console import output

    args_list, train_cmd = _split_train_cmd(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(args_list)
    except BrokenPipeError:  # `ftrain --help | head -1`
        _closed_pipe()
    except output.OutputUnwritable as exc:  # `ftrain --version >/dev/full`
        _unwritable("ftrain", exc)
    if train_cmd and args.command not in ("launch", "run"):
        _fail(2, f"ftrain {args.command}: error: unexpected arguments after --")
    args.train_cmd = train_cmd
    output.json_mode(bool(getattr(args, "json", False)))
    try:
        output.require_stdout()
        _light_imports()
        from ftrain.logs import configure

        configure()
        return _dispatch(args)
    except output.OutputClosed:
        _closed_pipe()
    except output.OutputUnwritable as exc:
        _unwritable(f"ftrain {args.command}", exc)
    except KeyboardInterrupt:
        _fail(130, f"ftrain {args.command}: interrupted")
    except Exception as exc:
        code, line = _refusal(args.command, exc)
        _fail(code, line)
    finally:
        output.json_mode(False)


def _light_imports() -> None:
    """Import structlog with `rich` out of its reach, and nats-py with `aiohttp` out of its reach unless the
    log's URL names a websocket server: structlog's development renderer would load rich (0.06 s) for
    tracebacks this CLI never renders, and nats-py loads aiohttp (0.09 s, where a package such as mlflow
    installed it) for its websocket transport alone. Only in this process, and only what is not loaded yet."""
    from ftrain import settings

    url = os.environ.get(settings.NATS_URL, "").lower()
    hidden = ["rich"] + ([] if "ws://" in url or "wss://" in url else ["aiohttp"])
    hidden = [name for name in hidden if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # `import name` raises ImportError
    try:
        import nats  # noqa: F401
        import structlog  # noqa: F401
    finally:
        for name in hidden:
            del sys.modules[name]


_USAGE = (
    ("ftrain.errors", "UsageError"),
    ("ftrain.settings", "InvalidSetting"),
    ("ftrain.events.schema", "InvalidEvent"),
    ("ftrain.host.private_files", "UnsafeDirectory"),
)
_REFUSED = (
    ("ftrain.errors", "Refused"),
    ("ftrain.events.log_port", "LogUnavailable"),
    ("ftrain.events.log_port", "LogTampered"),
    ("ftrain.events.keyring", "KeyringError"),
    ("ftrain.events.jetstream.nats_server", "NatsServerError"),
)


def _loaded(names: Sequence[tuple[str, str]]) -> tuple[type[BaseException], ...]:
    """The named exception classes whose modules are loaded: one never imported cannot have raised."""
    return tuple(getattr(sys.modules[m], n) for m, n in names if m in sys.modules)


def _refusal(command: str, exc: Exception) -> tuple[int, str]:
    """The exit code and the one line for an exception a command raised; anything else is a bug: re-raised."""
    if isinstance(exc, _loaded(_USAGE)):
        return 2, f"ftrain {command}: error: {exc}"
    if isinstance(exc, _loaded(_REFUSED)):
        return 1, f"ftrain {command}: {exc}"
    if "sqlite3" in sys.modules and isinstance(exc, sys.modules["sqlite3"].Error):
        return 1, f"ftrain {command}: read model error: {exc}"
    if isinstance(exc, _loaded((("nats.errors", "Error"),))):
        return 1, f"ftrain {command}: event log error: {exc}"
    if isinstance(exc, OSError):
        return 1, f"ftrain {command}: {exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
    raise exc


def _fail(code: int, line: str) -> NoReturn:
    if sys.stderr is not None:  # closed too: there is no one to tell, the exit code says it
        sys.stderr.write(visible(line) + "\n")  # one line, whatever a publisher put in a reason it quotes
    raise SystemExit(code)


def _closed_pipe() -> NoReturn:
    """The reader of stdout is gone: say nothing (there is no one to tell)."""
    _stdout_to_devnull()
    raise SystemExit(CLOSED_PIPE)


def _unwritable(who: str, exc: Exception) -> NoReturn:
    """Stdout is closed or refuses the write: one line on stderr, exit 1 (as `ls >/dev/full`)."""
    _stdout_to_devnull()
    _fail(1, f"{who}: cannot write the output: {exc}")


def _stdout_to_devnull() -> None:
    """Point descriptor 1 at /dev/null, so the interpreter's own flush at exit finds somewhere to write what
    is still buffered, and says nothing more."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)


def _dispatch(args: argparse.Namespace) -> int:
    """Run the command: the `entry` its module's parser set."""
    entry: Callable[[argparse.Namespace], int] = args.entry
    return entry(args)
