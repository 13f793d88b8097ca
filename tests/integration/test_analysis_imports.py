"""The restart-cost experiment's analysis and drawing in a fresh interpreter: they never import torch (the
analysis itself: tests/unit/test_restart_analysis.py)."""

from tests.support.processes import modules_imported_by


def test_the_analysis_and_the_drawing_never_import_torch() -> None:
    wanted = {"ftrain.experiments.inputs", "ftrain.experiments.plot", "ftrain.experiments.schedule"}
    loaded = modules_imported_by(wanted)
    assert wanted <= loaded
    assert not {m for m in loaded if m.partition(".")[0] == "torch"}
