"""The cost-curve scripts without running a grid: the state sizes `bench_checkpoint.py --state-gb` picks, the
least-squares slope, and the report and plot drawn from a made-up grid (the real one takes many minutes)."""

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import ROOT

SCRIPTS = ROOT / "scripts"
sys.path.insert(0, str(SCRIPTS))

import bench_checkpoint  # noqa: E402
import bench_scaling  # noqa: E402

from ftrain.examples.model import MODELS, parameter_count  # noqa: E402


@pytest.mark.parametrize("gb", [0.25, 0.5, 1.0, 2.0, 4.0])
def test_state_gb_picks_a_shape_within_two_percent(gb: float) -> None:
    layers, dim = bench_checkpoint.sized("85m", gb)
    params = parameter_count(MODELS["85m"] | {"layers": layers, "dim": dim})
    assert abs(params * bench_checkpoint.STATE_BYTES_PER_PARAM / 1e9 - gb) <= 0.02 * gb
    assert dim % MODELS["85m"]["heads"] == 0


def test_the_85m_size_is_the_85m_model() -> None:
    assert bench_checkpoint.sized("85m", 1.0) == (MODELS["85m"]["layers"], MODELS["85m"]["dim"])


def test_fit_recovers_slope_and_fixed_cost() -> None:
    assert bench_scaling.fit([0.25, 0.5, 1, 2], [0.75, 1.0, 1.5, 2.5]) == pytest.approx((1.0, 0.5))
    assert bench_scaling.fit([2.0], [3.0]) == (1.5, 0.0)


def made_up_grid() -> dict[str, Any]:
    """A grid as bench_scaling.py writes it: every figure `seconds per GB × GB + 0.1`."""
    points = []
    for gb in (0.25, 0.5, 1.0):
        for ranks in (1, 2):
            saves = {m: {"blocking": 0.1 * gb, "durable": 2 * gb + 0.1} for m in bench_checkpoint.METHODS}
            resume = {
                m: {"cold": gb + 0.1, "cached": 0.5 * gb}
                for m in (bench_checkpoint.RAW_LOAD, bench_checkpoint.FT_LOAD)
            }
            result = {"state_bytes": gb * 1e9, "saves": saves, "resume": resume}
            points.append({"target_gb": gb, "ranks": ranks, "rc": 0, "wall_s": 10 * gb, "result": result})
    limits = {"disk_write": 1.0, "disk_read": 2.0, "memcpy": 4.0}
    machine = {"date": "2026-12-01T00:00:00+00:00", "cores": 2, "memory_gb": 23.0, "fs": "ext4", "torch": "x"}
    return {
        "machine": machine | {"load_1min": [1.0, 2.0]},
        "repeats": 1,
        "limits": {"before": limits, "after": limits} | limits,
        "points": points,
        "skipped": [{"target_gb": 2.0, "ranks": 4, "why": "too big"}],
        "failed": [],
        "wall_s": 100.0,
    }


def test_report_and_plot_from_a_made_up_grid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import plot_scaling

    grid = made_up_grid()
    lines = bench_scaling.curves(grid)["save, durable"][bench_checkpoint.FT_SYNC]
    assert sorted(lines) == [1, 2]
    assert bench_scaling.fit([x for x, _, _ in lines[2]], [y for _, y, _ in lines[2]]) == pytest.approx(
        (2.0, 0.1)
    )
    bench_scaling.report(grid)
    out = capsys.readouterr().out
    assert "skipped 2.0 GB × 4 ranks: too big" in out
    png = tmp_path / "scaling.png"
    plot_scaling.draw(grid, png)
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert png.stat().st_size < 200_000


def test_a_point_too_big_for_memory_or_time_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    # the memory the machine has free is what other jobs leave: the time checks must not depend on it
    monkeypatch.setattr(bench_scaling, "available_bytes", lambda: 64 * bench_scaling.GB)
    done = [{"target_gb": 1.0, "ranks": 2, "rc": 0, "wall_s": 100.0}]
    assert bench_scaling.why_skip(1e6, 1, [], 1e9) is not None  # a petabyte: memory
    assert bench_scaling.why_skip(2.0, 2, done, 150.0) is not None  # ~200 s expected, 150 left
    assert bench_scaling.why_skip(2.0, 2, done, 250.0) is None
    assert bench_scaling.why_skip(2.0, 4, done, 1.0) is None  # no point with 4 ranks yet: nothing to scale
