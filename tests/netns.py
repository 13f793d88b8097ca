"""The multi-node harness (`scripts/cluster.py`) for tests: a cluster of network namespaces, skipped with one
clear reason where they cannot be made (not root), unless FTRAIN_REQUIRE_NETNS=1 (set by CI) makes that a
failure."""

import importlib.util
import os
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "cluster", Path(__file__).resolve().parent.parent / "scripts" / "cluster.py"
)
assert _spec is not None and _spec.loader is not None
cluster = importlib.util.module_from_spec(_spec)
sys.modules["cluster"] = cluster
_spec.loader.exec_module(cluster)


def require_netns() -> None:
    """Skip (or, with FTRAIN_REQUIRE_NETNS=1, fail) unless network namespaces can be made here."""
    why = cluster.unavailable()
    if why is None:
        return
    if os.environ.get("FTRAIN_REQUIRE_NETNS") == "1":
        pytest.fail(f"multi-node tests required (FTRAIN_REQUIRE_NETNS=1) but {why}")
    pytest.skip(f"multi-node tests: {why}")
