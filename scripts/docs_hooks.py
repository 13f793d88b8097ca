"""MkDocs hook: the CLI reference page is generated from `ftrain.cli.main.build_parser()` at every build, so
the page and the parser cannot disagree (an option added, renamed or re-documented shows up by itself).

`docs/cli-reference.md` holds the marker `<!-- cli-reference -->`; the hook replaces it with one section per
command: its usage, its description and epilog, and a table of its arguments.
"""

import argparse
from collections.abc import Iterator
from typing import Any

MARKER = "<!-- cli-reference -->"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Fill in the generated reference on the page that asks for it."""
    if MARKER not in markdown:
        return markdown
    from ftrain.cli.main import build_parser

    return markdown.replace(MARKER, cli_reference(build_parser()))


def cli_reference(parser: argparse.ArgumentParser) -> str:
    """Markdown for every command under `parser`, depth first, in the order they were added."""
    return "\n".join(_section(name, p, helptext) for name, p, helptext in _commands(parser, "ftrain", None))


def _commands(
    parser: argparse.ArgumentParser, name: str, helptext: str | None
) -> Iterator[tuple[str, argparse.ArgumentParser, str | None]]:
    yield name, parser, helptext
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for sub_name, sub in action.choices.items():
                yield from _commands(sub, f"{name} {sub_name}", helps.get(sub_name))


def _section(name: str, parser: argparse.ArgumentParser, helptext: str | None) -> str:
    level = "#" * min(name.count(" ") + 2, 4)
    parser.prog = name
    usage = "\n".join(
        line.removeprefix(" " * len("usage: "))
        for line in parser.format_usage().removeprefix("usage: ").splitlines()
    ).strip()
    parts = [f"{level} `{name}`", ""]
    if helptext and name != "ftrain":
        parts += [_cell(helptext, table=False), ""]
    parts += ["```text", usage, "```", ""]
    if parser.description:
        parts += [parser.description, ""]
    formatter = parser._get_formatter()
    rows = [
        _row(a, formatter._format_action_invocation(a))
        for a in parser._actions
        if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)
    ]
    if rows:
        parts += ["| argument | default | meaning |", "|---|---|---|", *rows, ""]
    if parser.epilog:
        parts += ["```text", parser.epilog.strip("\n"), "```", ""]
    return "\n".join(parts)


def _row(action: argparse.Action, flags: str) -> str:
    """One argument as `--help` names it, its default, and its help text with its choices."""
    shown = action.default not in (None, False, argparse.SUPPRESS) and not action.required
    default = f"`{_cell(str(action.default), code=True)}`" if shown else ""
    meaning = _expand(action)
    if action.required and action.option_strings:
        meaning += " (required)"
    return f"| `{_cell(flags, code=True)}` | {default} | {_cell(meaning.strip())} |"


def _expand(action: argparse.Action) -> str:
    """The help text with argparse's `%(default)s`-style placeholders filled in, as `--help` shows it."""
    if not action.help:
        return ""
    params = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
    if action.choices is not None:
        params["choices"] = ", ".join(map(str, action.choices))
    try:
        return action.help % params
    except (KeyError, TypeError, ValueError):
        return action.help


def _cell(text: str, *, table: bool = True, code: bool = False) -> str:
    """One line of text, safe in a Markdown table cell. In a code span (`code`) a `|` stays as it is: the
    table extension does not split cells inside backticks, and a `\\|` there would be shown with its
    backslash (`--checkpoint-every DURATION\\|Nsteps`)."""
    text = " ".join(text.split())
    return text.replace("|", "\\|") if table and not code else text
