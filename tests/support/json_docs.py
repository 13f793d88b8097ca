"""The `--json` documents as docs/event-log.md lists them: each command's top-level members, read from the
page so that a test can hold every command's real output to it."""

import re

from tests.support.paths import ROOT

PAGE = ROOT / "docs" / "event-log.md"
SECTION = "## The `--json` documents"
BULLET = re.compile(r"`(ftrain [^`]+)`(, [a-z ]+)?: (.*)")
TOKEN = re.compile(r"`([^`]*)`|[({\[]|[)}\]]")
MEMBER = re.compile(r"[a-z_]+")


def documented() -> dict[str, set[str]]:
    """Label (`ftrain status RUN --json`, `ftrain server status --json, running`) → its top-level members."""
    section = PAGE.read_text("utf-8").split(SECTION, 1)[1].split("\n## ", 1)[0]
    bullets: list[str] = []
    inside = False
    for line in section.splitlines():
        if line.startswith("- `ftrain "):
            bullets.append(line[2:])
            inside = True
        elif inside and line.startswith("  "):
            bullets[-1] += " " + line.strip()
        else:
            inside = False
    members = {}
    for bullet in bullets:
        match = BULLET.fullmatch(bullet)
        assert match is not None, f"a --json bullet of {PAGE.name} not in the form `ftrain …`: …: {bullet}"
        members[match[1] + (match[2] or "")] = top_level(match[3])
    return members


def top_level(text: str) -> set[str]:
    """The backticked member names outside every parenthesis and bracket."""
    depth, names = 0, set()
    for token in TOKEN.finditer(text):
        if token[1] is not None:
            if depth == 0 and MEMBER.fullmatch(token[1]):
                names.add(token[1])
        elif token[0] in "({[":
            depth += 1
        else:
            depth -= 1
    return names
