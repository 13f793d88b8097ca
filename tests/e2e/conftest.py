"""The e2e tier's own fixture: the multi-node tests' cluster of network-namespace nodes (`nodes`, one per
session, tests/support/netns.py)."""

from tests.support.netns import nodes as nodes
