"""torchrun's failure block is left out when the worker already said why in one line (issue 34); the block
below is what torchrun 2.13 printed here for a worker that exited 83."""

import pytest

from ftrain.supervise.failure_block import FailureBlock

BLOCK = """\
E1205 08:31:10.259000 10190 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: {code}) local_rank: 0 (pid: 10609) of binary: /venv/bin/python
Traceback (most recent call last):
  File "/venv/bin/torchrun", line 6, in <module>
    sys.exit(main())
             ^^^^^^
  File "/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
x83.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-05_08:31:10
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : {code} (pid: 10609) 
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""  # noqa: W291
BEFORE = "W1205 torch/distributed/run.py:874] Setting OMP_NUM_THREADS\nPREEMPTED by SIGUSR1: checkpoint at step 12 saved, exiting\n"


def passed(text: str, piece: int) -> str:
    block = FailureBlock()
    out = "".join(block.feed(text[i : i + piece]) for i in range(0, len(text), piece))
    return out + block.end()


@pytest.mark.parametrize("piece", [1, 7, 4096])
@pytest.mark.parametrize("code", [83, 84])
def test_the_block_is_left_out_when_the_worker_said_why(piece: int, code: int) -> None:
    assert passed(BEFORE + BLOCK.format(code=code) + "after\n", piece) == BEFORE + "after\n"


@pytest.mark.parametrize("code", [1, -9])
def test_any_other_block_is_written_as_it_came(code: int) -> None:
    text = BEFORE + BLOCK.format(code=code)
    assert passed(text, 5) == text


def test_a_block_cut_short_and_a_moving_progress_bar_are_written_as_they_came() -> None:
    cut = BEFORE + BLOCK.format(code=83)[:400]
    assert passed(cut, 3) == cut
    block = FailureBlock()
    assert block.feed("step 1/3\rstep 2/3\rste") == "step 1/3\rstep 2/3\r"
    assert block.end() == "ste"
