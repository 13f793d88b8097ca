"""Where the tests find the repository's own files: one root for every test and helper, whatever its tier."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository's root (this file is tests/support/paths.py)."""
VECTORS = ROOT / "tests" / "vectors"
"""The stored-format test vectors that docs/event-log.md describes."""
