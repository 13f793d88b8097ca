"""How far each run's lifecycle reached each tracker: the seq of the last event delivered, kept in a private
SQLite file of the ftrain home, so a requeued job's supervisor goes on where the last one stopped (the log is
the outbox: what lies past the cursor is what the tracker still lacks)."""

import sqlite3
from pathlib import Path

from ftrain.host.private_files import private_dir, private_file

SCHEMA = """CREATE TABLE IF NOT EXISTS delivered (
    run_id TEXT NOT NULL, tracker TEXT NOT NULL, seq INTEGER NOT NULL, PRIMARY KEY (run_id, tracker))"""
BUSY_TIMEOUT_S = 30.0


def cursor_path(home: Path) -> Path:
    """One file per ftrain home."""
    return home / "trackers.sqlite"


class Cursors:
    """The delivered seqs, through one connection (used by one thread)."""

    def __init__(self, path: Path) -> None:
        private_dir(path.parent)
        private_file(path)
        self._db = sqlite3.connect(
            path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
        self._db.execute(SCHEMA)

    def delivered(self, run_id: str, tracker: str) -> int:
        """The seq of the run's last event `tracker` took (0: none)."""
        row = self._db.execute(
            "SELECT seq FROM delivered WHERE run_id = ? AND tracker = ?", (run_id, tracker)
        ).fetchone()
        return int(row[0]) if row else 0

    def advance(self, run_id: str, tracker: str, seq: int) -> None:
        """`tracker` took the run's events up to `seq`."""
        self._db.execute(
            "INSERT INTO delivered (run_id, tracker, seq) VALUES (?, ?, ?) "
            "ON CONFLICT (run_id, tracker) DO UPDATE SET seq = max(seq, excluded.seq)",
            (run_id, tracker, seq),
        )

    def close(self) -> None:
        self._db.close()
