"""The docs' code blocks read as the convention says (tests/support/docs.py): every block is runnable or
shown, every skip gives its reason, a skipped Python block still compiles, and commands split on prompts and
continuations (the blocks run: tests/integration/test_docs.py and tests/e2e/test_docs.py)."""

import pytest

from tests.support.docs import ALL, FLAGS, RUN, RUNNABLE, SHOWN, Block, commands


def test_every_block_says_what_it_is_and_every_skip_why() -> None:
    unknown = [b.name for b in ALL if b.lang not in RUNNABLE | SHOWN]
    assert not unknown, f"blocks tagged neither runnable ({RUNNABLE}) nor shown ({SHOWN}): {unknown}"
    unexplained = [b.name for b in ALL if b.skip == "?"]
    assert not unexplained, f"`docs-test: skip` without a reason: {unexplained}"
    odd = [b.name for b in ALL if b.flags and not b.skip and set(b.flags.split()) - FLAGS]
    assert not odd, f"docs-test flags other than e2e, repo or skip REASON: {odd}"
    assert len(RUN) >= 10, [b.name for b in RUN]


@pytest.mark.parametrize("block", [b for b in ALL if b.lang == "python" and b.skip], ids=lambda b: b.name)
def test_a_skipped_python_block_still_compiles(block: Block) -> None:
    compile(block.body, block.name, "exec")


def test_commands_split_on_prompts_and_continuations() -> None:
    body = "$ a --x \\\n    --y\nout\n$ b  # exit 1\n"
    assert list(commands(body)) == [("a --x \\\n    --y", 0), ("b  # exit 1", 1)]
