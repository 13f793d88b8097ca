"""One tree of errors under `FtrainError`, importable from `ftrain.errors` and where scripts already import
them (issue 34)."""

import subprocess
import sys

from ftrain import errors
from ftrain.train import checkpointing, resume, resume_load, save_check, saving
from ftrain.workers.storage import storage_errors as storage_errors


def test_every_documented_error_is_an_ftrain_error_and_keeps_its_old_name_and_base() -> None:
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.FtrainError), name
    for module in (checkpointing, resume, resume_load, saving, save_check, storage_errors):
        for name in set(errors.__all__) & set(vars(module)):
            assert getattr(module, name) is getattr(errors, name), (module.__name__, name)
    for old in ("NoValidCheckpoint", "ResumeRefused", "ResumeStopped", "ResumeFailed", "SavesFailing",
                "UnresumableState", "Fenced"):  # fmt: skip
        assert issubclass(getattr(checkpointing, old), RuntimeError), old
    assert issubclass(errors.UnknownRun, errors.ResumeRefused)
    assert issubclass(errors.MissingCredentials, errors.StorageUnavailable)


def test_the_tree_imports_without_torch() -> None:
    code = "import sys, ftrain.errors; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
