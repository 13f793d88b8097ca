"""The CLI's conventions that the parser alone shows (issue 26): help and an example on every command and
option, compound and Slurm durations for `--checkpoint-every`, an old launch read as a GPU job (the
conventions that take real processes, a real nats-server and a real bash:
tests/integration/test_cli_conventions.py)."""

import argparse

import pytest

from ftrain.cadence import parse_checkpoint_every
from ftrain.cli.main import build_parser
from ftrain.events.schema import Launched, decode_event


def subcommands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    """Every (command path, parser, the subparsers action that offers it) of the tree."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helped = {a.dest: a.help for a in action._choices_actions}
            for name, child in action.choices.items():
                yield (*path, name), child, helped.get(name)
                yield from subcommands(child, (*path, name))


def test_every_command_and_option_has_help_and_every_command_an_example() -> None:
    missing = []
    tree = list(subcommands(build_parser()))
    assert len(tree) > 20
    for path, parser, helped in tree:
        name = " ".join(path)
        if not helped:
            missing.append(f"command {name}")
        if "examples:\n  $ ftrain " not in (parser.epilog or ""):
            missing.append(f"example of {name}")
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
                continue
            if not action.help or action.help == argparse.SUPPRESS:
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
    assert missing == []


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1h30m", 5400), ("90s", 90), ("2h", 7200), ("10min", 600), ("1d12h", 129600), ("05:00", 300),
     ("1:30:00", 5400), ("2-00:00:00", 172800), ("1-12", 129600), ("1-12:30", 131400)],
)  # fmt: skip
def test_compound_and_slurm_durations(text: str, seconds: float) -> None:
    assert parse_checkpoint_every(text).seconds == seconds


def test_an_old_launch_without_devices_reads_as_a_gpu_job() -> None:
    old = (
        b'{"type":"launched","run_id":"r","seq":1,"project":"P","strategy":"fsdp","nodes":2,"gpus_per_node":4,'
        b'"hosts":["a","b"],"allocation_source":"nodelist","rdzv_endpoint":"a:1","command":[],"storage":"/x"}'
    )
    event = decode_event(old)
    assert isinstance(event, Launched) and event.devices != "cpu"


def test_every_run_id_argument_takes_the_one_rule() -> None:
    """One rule for run ids (events/run_id.py), no dots (issue 32: `status a.b` was refused for a "run"
    that `list` and `audit` named, now a stray under no run's subject): every argument that names a run or
    a project parses with it, so every command refuses `a.b` alike, `launch --run-id` included."""
    from ftrain.cli.arguments import project as _project
    from ftrain.cli.arguments import run_id as _run_id

    checked = []
    for path, parser, _ in subcommands(build_parser()):
        for action in parser._actions:
            if action.dest in ("run_id", "run", "project") and not isinstance(
                action, argparse._SubParsersAction
            ):
                assert action.type in (_run_id, _project), (path, action.dest)
                checked.append((*path, action.dest))
    assert {("status", "run_id"), ("audit", "verify", "run_id"), ("launch", "run_id"), ("run", "run_id"),
            ("events", "tail", "run_id"), ("cost", "run"), ("launch", "project")} <= set(checked)  # fmt: skip
    with pytest.raises(argparse.ArgumentTypeError, match=r"'a\.b' is invalid"):
        _run_id("a.b")


def test_every_command_names_the_function_that_runs_it() -> None:
    """Each command module adds its commands with `add_parser` and sets `entry` on each (issue 33): main.py
    dispatches on nothing else."""
    leaves = [(path, parser) for path, parser, _ in subcommands(build_parser())
              if not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)]  # fmt: skip
    assert len(leaves) > 20
    assert [path for path, parser in leaves if not callable(parser.get_default("entry"))] == []
