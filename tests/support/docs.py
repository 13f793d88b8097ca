"""The docs' code blocks, for the tests that hold README.md and docs/ to what they show.

The convention (docs/architecture.md, "The docs are tested"): a `console` block's `$ ` lines are commands that
must exit 0 (or the `# exit N` they end with), a `python` block runs as a script, any other language only
shows something; `<!-- docs-test: e2e -->` before a block runs it in the e2e tier only
(tests/e2e/test_docs.py, the others in tests/integration/test_docs.py), `repo` runs it in the repository's
root, `skip REASON` not at all (Python is still compiled: tests/unit/test_docs_blocks.py). A page's blocks of
one tier are one test: they run in order in one scratch directory with a fresh FTRAIN_HOME, and the servers
they start are stopped at the end.
"""

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.paths import ROOT

BIN = Path(sys.executable).parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNABLE = {"console", "python"}
SHOWN = {"text", "json", "toml", "yaml"}
FLAGS = {"e2e", "repo"}
"""The flags a block may carry besides `skip REASON`."""
FENCE = re.compile(
    r"^(?:<!-- docs-test: (?P<flags>[^\n]*?) -->\n)?```(?P<lang>[^\n]*)\n(?P<body>.*?)^```$", re.M | re.S
)
EXIT = re.compile(r"#\s*exit (\d+)\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page, and what its docs-test comment says."""

    page: Path
    line: int
    lang: str
    body: str
    flags: str

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def skip(self) -> str | None:
        """Why the block is not run (None: it runs)."""
        return self.flags.removeprefix("skip").strip() or "?" if self.flags.startswith("skip") else None

    @property
    def e2e(self) -> bool:
        return "e2e" in self.flags.split()

    @property
    def in_repo(self) -> bool:
        return "repo" in self.flags.split()


def blocks(page: Path) -> Iterator[Block]:
    text = page.read_text()
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start("lang")) + 1
        yield Block(page, line, match["lang"].strip(), match["body"], (match["flags"] or "").strip())


ALL = [block for page in PAGES for block in blocks(page)]
RUN = [block for block in ALL if block.lang in RUNNABLE and block.skip is None]


def commands(body: str) -> Iterator[tuple[str, int]]:
    """The `$ ` lines of a console block (a trailing backslash continues one), each with its expected status."""
    pending: list[str] = []
    for line in body.splitlines():
        if pending or line.startswith("$ "):
            pending.append(line.removeprefix("$ ") if not pending else line)
            if not line.endswith("\\"):
                command = "\n".join(pending)
                status = EXIT.search(command)
                yield command, int(status[1]) if status else 0
                pending = []


class Scratch:
    """One page's working directory (`work`) and FTRAIN_HOME (`home`); the servers its blocks started are
    stopped at the end."""

    def __init__(self, where: Path) -> None:
        self.where = where
        (where / "work").mkdir(parents=True)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("FTRAIN_", "AWS_"))}
        env.update(FTRAIN_HOME=str(self.where / "home"), PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}")
        return env

    def close(self) -> None:
        if (self.where / "home").exists():
            for server in ("server", "storage"):
                subprocess.run(
                    [BIN / "ftrain", server, "stop"], env=self.env(), capture_output=True, timeout=60
                )


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Scratch]:
    """The scratch directory of one test's page (a test module takes it with `scratch as scratch`)."""
    page = Scratch(tmp_path / "docs")
    yield page
    page.close()


def by_page(selected: list[Block]) -> list[list[Block]]:
    """`selected` grouped by page, each page's blocks in their order: a page is one test, since its blocks
    build on each other (and so run in order whatever order the tests run in, and on one xdist worker)."""
    grouped: dict[Path, list[Block]] = {}
    for block in selected:
        grouped.setdefault(block.page, []).append(block)
    return list(grouped.values())


def page_name(page_blocks: list[Block]) -> str:
    return str(page_blocks[0].page.relative_to(ROOT))


def page_runs_as_written(page_blocks: list[Block], scratch: Scratch) -> None:
    """Run a page's blocks in order in its scratch directory (`runs_as_written`)."""
    for block in page_blocks:
        runs_as_written(block, scratch)


def runs_as_written(block: Block, scratch: Scratch) -> None:
    """Run `block` in its page's scratch directory; each command must end with the status it shows."""
    cwd = ROOT if block.in_repo else scratch.where / "work"
    env = scratch.env()
    if block.lang == "python":
        script = scratch.where / f"block-{block.line}.py"
        script.write_text(block.body)
        steps = [([str(BIN / "python"), str(script)], 0, f"python block at {block.name}")]
    else:
        steps = [(["bash", "-c", command], status, command) for command, status in commands(block.body)]
    assert steps, f"{block.name}: a console block without a `$ ` command"
    for argv, status, shown in steps:
        done = subprocess.run(
            argv, cwd=cwd, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL
        )
        output = (done.stdout + done.stderr)[-3000:]
        assert done.returncode == status, f"{block.name}: `{shown}` exited {done.returncode}:\n{output}"
