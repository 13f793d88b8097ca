"""The e2e tier's own fixture, the multi-node tests' cluster of network-namespace nodes (`nodes`, one per
session, tests/support/netns.py), and how the tier shares the two cores (`make test-e2e`: `-n 2 --dist
loadgroup`).

Each test is put in an xdist group, and a group runs on one worker, in file order:
- `slurm`: every test of a real Slurm cluster (`slurm`, `slurm2`). A session's clusters are one worker's, and a
  single-node job's rendezvous is the host's port 29500, which two clusters at once would both take.
- `netns`: every test of the namespace cluster (`nodes`): on a second worker it would be built a second time.
- otherwise the test's module: a module's fixtures (a reference run, the restart experiment) run once.
The two cluster groups are queued first: they are the longest, and the Slurm tests mostly wait (a tenth to
nine tenths of a core), so the other worker's training runs beside them. A test marked `alone` (its subject
is timing that a second test on the cores distorts) is left out of this run and run after it, by itself.

The group is set as each test is collected, so it is there whichever `pytest_collection_modifyitems` runs
first: xdist reads the marks in its own, and writes the group into the test's node id (`…::test_x@slurm`),
which it schedules by. A test that lost its group (pytest 9.2 with xdist 3.8,
pytest-dev/pytest-xdist#1386, hence the pin) fails before its fixtures start.
"""

from typing import Final

import pytest

from tests.support.netns import nodes as nodes

FIRST: Final = ("slurm", "netns")


def group_of(item: pytest.Item) -> str:
    """The xdist group `item` runs in."""
    fixtures = set(getattr(item, "fixturenames", ()))
    if fixtures & {"slurm", "slurm2"}:
        return "slurm"
    if "nodes" in fixtures:
        return "netns"
    return item.path.stem


def pytest_itemcollected(item: pytest.Item) -> None:
    item.add_marker(pytest.mark.xdist_group(group_of(item)))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The cluster groups first, the rest in file order (`--no-loadscope-reorder` keeps this order)."""
    items.sort(key=lambda item: FIRST.index(g) if (g := group_of(item)) in FIRST else len(FIRST))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Under `--dist loadgroup`, a test that xdist did not put in its group fails before its fixtures start."""
    if getattr(item.config.option, "loadgroup", False) and not item.nodeid.endswith(f"@{group_of(item)}"):
        pytest.fail(
            f"xdist ignored the e2e tier's groups (pytest-dev/pytest-xdist#1386): {item.nodeid} has none, and two "
            "Slurm or namespace clusters would run at once",
            pytrace=False,
        )
