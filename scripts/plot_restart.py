"""Render a restart-cost experiment's plot and report again, from its directory or from run ids.

    .venv/bin/python scripts/plot_restart.py DIR [DIR ...]
    .venv/bin/python scripts/plot_restart.py --baseline RUN --sync RUN [--async RUN] [--memory RUN] --out DIR

A directory written by `scripts/restart_experiment.py` gets `restart_plot.png` and `restart_report.md`
rewritten in place, from its event log (its own embedded server, or the FTRAIN_NATS_URL it used), its metrics,
the supervisor's output and the driver's kill records. Run ids are read from the log FTRAIN_* points at; each
run's metrics are found where its recorded command put them. Exit 1 when a cross-check fails.
"""

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from ftrain.experiments.inputs import analyze_directory, analyze_runs
from ftrain.experiments.plot import publish
from ftrain.experiments.results import ExperimentResult
from ftrain.logs import configure as configure_logging


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("dirs", nargs="*", type=Path, help="experiment directories")
    p.add_argument("--baseline", help="run id of the run without failures")
    p.add_argument("--sync", help="run id of the sync run with failures")
    p.add_argument("--async", dest="async_", help="run id of the async run with failures")
    p.add_argument("--memory", help="run id of the run with failures and the memory tier")
    p.add_argument("--out", type=Path, help="where to write the plot and report of run ids")
    args = p.parse_args(argv)
    runs = (args.baseline, args.sync, args.async_, args.memory)
    if bool(args.dirs) == any(runs):
        p.error("give experiment directories, or run ids (--baseline and more), not both")
    if any(runs) and (args.baseline is None or args.out is None or not any(runs[1:])):
        p.error("run ids need --baseline, one or more of --sync, --async and --memory, and --out")
    return args


def show(result: ExperimentResult, where: Path) -> bool:
    """Write the plot and report; print where, and any mismatch. True when every check held."""
    plot, report = publish(result, where)
    print(f"plot:   {plot}\nreport: {report}")
    for problem in result.problems:
        print(f"MISMATCH {problem}")
    return not result.problems


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging()
    if args.dirs:
        results = [(asyncio.run(analyze_directory(d.absolute())), d) for d in args.dirs]
    else:
        phases = {"baseline": args.baseline, "sync": args.sync, "async": args.async_, "memory": args.memory}
        results = [(asyncio.run(analyze_runs({p: r for p, r in phases.items() if r})), args.out)]
    return 0 if all([show(result, where) for result, where in results]) else 1


if __name__ == "__main__":
    sys.exit(main())
