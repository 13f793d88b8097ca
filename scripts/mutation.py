"""`make mutation`: mutation testing of the pure core with the unit tier, and the score of each module.

Runs mutmut (configured in pyproject.toml's `[tool.mutmut]`: which modules, which tests), then prints per module
the mutants killed, the equivalent ones, the score (killed / (total - equivalent)) and the raw rate (killed /
total). A survivor listed in tests/mutation_equivalents.txt (`<mutant name>  # why no behaviour tells it apart`)
is equivalent. mutmut mutates function bodies only, so the constants and defaults a stored format or the fold
depends on are mutated here too (CONSTANTS), each in a copy of the tree. Any other survivor, or a mutant no test
reaches, fails the run. Not part of CI: slow (about seven minutes on two cores).

    python scripts/mutation.py [--max-children N] [--report-only]
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EQUIVALENTS = ROOT / "tests" / "mutation_equivalents.txt"
KILLED = {"killed", "timeout", "caught by type check"}
PACKAGES = ("events", "projections", "workers", "ftrain", "tests", "scripts", "docs", "README.md")
"""What the copies of the tree hold: the code, and what the unit tier reads besides it (`also_copy` for mutmut)."""
CONSTANTS: tuple[tuple[str, str, str], ...] = (
    ("ftrain/events/chain.py", 'GENESIS = "0" * 64', 'GENESIS = "0" * 63'),
    ("ftrain/events/chain.py", 'GENESIS = "0" * 64', 'GENESIS = "1" * 64'),
    ("ftrain/events/schema.py", "    seq: Count = 0", "    seq: Count = 1"),
    ("ftrain/workers/manifest.py", "FORMAT = 2", "FORMAT = 3"),
    ("ftrain/workers/integrity.py", 'ALGORITHM: Final = "sha256"', 'ALGORITHM: Final = "sha-256"'),
    ("ftrain/workers/layout.py", 'MARKER: Final = ".complete"', 'MARKER: Final = ".done"'),
    ("ftrain/domain/lifecycle/run_state.py", "    step: int = 0", "    step: int = 1"),
    ("ftrain/domain/lifecycle/run_state.py", "    epoch: int = 0", "    epoch: int = 1"),
    ("ftrain/domain/lifecycle/run_state.py", "    resume_count: int = 0", "    resume_count: int = 1"),
)
"""(file, text, mutated text): mutants mutmut does not make. Each must be killed; none is equivalent."""
_RESULT = re.compile(r"^\s*(?P<name>(?P<module>[\w.]+?)\.x[_ǁ]\S+): (?P<status>.+)$")


def equivalents() -> dict[str, str]:
    """Mutant name → the reason it is equivalent."""
    listed: dict[str, str] = {}
    for line in EQUIVALENTS.read_text("utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, reason = line.partition("#")
            listed[name.strip()] = reason.strip()
    return listed


def results(mutmut: list[str]) -> list[tuple[str, str, str]]:
    """(module, mutant, status) of every mutant of the last run."""
    out = subprocess.run(
        [*mutmut, "results", "--all", "true"], cwd=ROOT, check=True, capture_output=True, text=True
    )
    return [
        (m["module"], m["name"], m["status"])
        for line in out.stdout.splitlines()
        if (m := _RESULT.match(line))
    ]


def constant_survivors() -> list[str]:
    """Apply each of CONSTANTS to a copy of the tree and run the unit tier; the mutants that pass."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]["mutmut"]
    tests = [*config["pytest_add_cli_args"], *config["pytest_add_cli_args_test_selection"]]
    survivors = []
    for path, text, mutated in CONSTANTS:
        with tempfile.TemporaryDirectory() as tmp:
            for name in (*PACKAGES, "pyproject.toml"):
                copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy2
                copy(ROOT / name, Path(tmp) / name)
            source = Path(tmp) / path
            original = source.read_text("utf-8")
            assert original.count(text) == 1, f"{path}: {text!r} must occur once"
            source.write_text(original.replace(text, mutated), "utf-8")
            run = [sys.executable, "-m", "pytest", "-q", "-x", *tests]
            env = {**os.environ, "PYTHONPATH": tmp}
            if subprocess.run(run, cwd=tmp, capture_output=True, env=env, check=False).returncode == 0:
                survivors.append(f"{path}: {text!r} → {mutated!r}: survived")
    print(f"constants: {len(CONSTANTS) - len(survivors)} of {len(CONSTANTS)} killed")
    return survivors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-children", type=int, default=2)
    parser.add_argument("--report-only", action="store_true", help="score the last run, run nothing")
    args = parser.parse_args()
    mutmut = [sys.executable, "-m", "mutmut"]
    if not args.report_only:
        subprocess.run([*mutmut, "run", "--max-children", str(args.max_children)], cwd=ROOT, check=False)
    explained = equivalents()
    per_module: dict[str, Counter[str]] = defaultdict(Counter)
    unexplained: list[str] = []
    for module, name, status in results(mutmut):
        verdict = "killed" if status in KILLED else "equivalent" if name in explained else status
        per_module[module][verdict] += 1
        if verdict not in ("killed", "equivalent"):
            unexplained.append(f"{name}: {status}")
    print(f"{'module':<36} {'killed':>7} {'equiv.':>7} {'total':>6} {'score':>7} {'raw':>7}")
    for module, counts in sorted(per_module.items()):
        total = sum(counts.values())
        killed, equivalent = counts["killed"], counts["equivalent"]
        score = killed / (total - equivalent) if total > equivalent else 1.0
        print(f"{module:<36} {killed:>7} {equivalent:>7} {total:>6} {score:>7.1%} {killed / total:>7.1%}")
    unexplained += constant_survivors()
    for line in unexplained:
        print(f"unexplained: {line}")
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
