"""The docs' `e2e` blocks run as written: the commands and Python blocks of README.md and docs/ marked
`<!-- docs-test: e2e -->` (training jobs, the demo, the benchmarks; the convention:
tests/support/docs.py)."""

import pytest

from tests.support.docs import RUN, Block, Scratch, by_page, page_name, page_runs_as_written
from tests.support.docs import scratch as scratch  # the fixture


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("page", by_page([b for b in RUN if b.e2e]), ids=page_name)
def test_the_page_runs_as_written(page: list[Block], scratch: Scratch) -> None:
    page_runs_as_written(page, scratch)
