"""The tracker identity every attempt of a run gets in its environment, so the user's own `wandb.init()` and
`mlflow.start_run()` continue one tracker run across failures, relaunches and requeues. Pure."""

import hashlib
from collections.abc import Mapping

WANDB_ID_MAX = 64
"""The longest W&B run id ftrain hands out. An ftrain run id's characters (`[A-Za-z0-9_-]`) are all ones W&B
allows; only its length (up to 128) can be too much."""


def wandb_run_id(run_id: str) -> str:
    """The W&B run id of ftrain run `run_id`: the run id itself when short enough, else its head and a digest
    of the whole, so two ftrain runs of one log never share one and every attempt and requeue finds the same."""
    if len(run_id) <= WANDB_ID_MAX:
        return run_id
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:12]
    return f"{run_id[: WANDB_ID_MAX - 13]}-{digest}"


def tracker_env(env: Mapping[str, str], run_id: str, mlflow_run_id: str | None) -> dict[str, str]:
    """The variables an attempt of `run_id` gets so its tracker runs continue one run: the W&B id (a user's own
    `WANDB_RUN_ID` is kept) with `WANDB_RESUME=allow`, and the run's MLflow run when it has one."""
    given = {"WANDB_RUN_ID": env.get("WANDB_RUN_ID") or wandb_run_id(run_id), "WANDB_RESUME": "allow"}
    return {**given, "MLFLOW_RUN_ID": mlflow_run_id} if mlflow_run_id else given
