"""`ftrain demo`: its parser, and the entry that loads the demo it runs (`cli/demo.py`, the training run;
`cli/demo_log.py`, the control plane only) when it runs."""

import argparse

from ftrain.cli.arguments import Subparsers, command


def add_parser(sub: Subparsers) -> None:
    """`demo`."""
    p = command(sub, "demo", "a 2-process CPU training run, SIGKILLed and resumed, checked bit for bit", [
        "ftrain demo", "ftrain demo --log-only",
    ])  # fmt: skip
    p.add_argument("--log-only", action="store_true", help="the control-plane scenario only (no torch)")
    p.add_argument(
        "--s3", action="store_true", help="checkpoint to the embedded SeaweedFS (`ftrain storage start`)"
    )
    p.set_defaults(entry=_demo)


def _demo(args: argparse.Namespace) -> int:
    """Play the demo through the CLI's own entry point, as a user would type it."""
    from ftrain.cli.demo_runner import Shell
    from ftrain.cli.main import main

    if args.log_only:
        from ftrain.cli.demo_log import run_log_demo

        return run_log_demo(Shell(main))
    from ftrain.cli.demo import run_demo

    return run_demo(Shell(main), s3=args.s3)
