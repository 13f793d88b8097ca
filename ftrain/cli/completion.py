"""`ftrain completion bash|zsh`: the shell's completion script, generated from the parser itself (shtab), so
it always offers exactly the commands and options this version has.

    source <(ftrain completion bash)                # bash: now, or in ~/.bashrc
    ftrain completion zsh > "${fpath[1]}/_ftrain"   # zsh: once, then restart the shell
"""

import argparse

from ftrain.cli.arguments import Subparsers, command
from ftrain.console.output import emit_text


def print_completion(parser: argparse.ArgumentParser, shell: str) -> int:
    """Print the completion script for `shell`."""
    import shtab

    emit_text(shtab.complete(parser, shell=shell))
    return 0


def add_parser(sub: Subparsers) -> None:
    """`completion`."""
    p = command(sub, "completion", "print the shell completion script", [
        "ftrain completion bash > ~/.local/share/bash-completion/completions/ftrain",
        "ftrain completion zsh > ~/.zfunc/_ftrain", "source <(ftrain completion bash)",
    ])  # fmt: skip
    p.add_argument("shell", choices=("bash", "zsh"), help="the shell to complete in")
    p.set_defaults(entry=_complete)


def _complete(args: argparse.Namespace) -> int:
    from ftrain.cli.main import build_parser  # the whole tree, this command's parser among it

    return print_completion(build_parser(), args.shell)
