"""`ftrain completion bash|zsh`: the shell's completion script, generated from the parser itself (shtab), so
it always offers exactly the commands and options this version has.

    source <(ftrain completion bash)                # bash: now, or in ~/.bashrc
    ftrain completion zsh > "${fpath[1]}/_ftrain"   # zsh: once, then restart the shell
"""

import argparse

from ftrain.console.output import emit_text


def print_completion(parser: argparse.ArgumentParser, shell: str) -> int:
    """Print the completion script for `shell`."""
    import shtab

    emit_text(shtab.complete(parser, shell=shell))
    return 0
