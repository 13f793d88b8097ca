"""Which trackers a run has, from the supervisor's environment: the MLflow run every attempt continues (found
in the log, given by the user, or created once), and the feed of ftrain's lifecycle into it.

W&B needs nothing created: its run id is derived (`identity.wandb_run_id`), and ftrain writes no lifecycle
into it: in offline mode the run's files belong to the user's process, and a second writer would conflict."""

import sys
import time
from collections.abc import Mapping

from ftrain import settings
from ftrain.console.visible_text import visible
from ftrain.trackers.cursor import Cursors, cursor_path
from ftrain.trackers.feed import TrackerFeed
from ftrain.trackers.mlflow_rest import MlflowServer, MlflowTracker
from ftrain.trackers.tracker_port import TrackerDown


def mlflow_server(env: Mapping[str, str]) -> MlflowServer | None:
    """The MLflow server `MLFLOW_TRACKING_URI` names, when it is one ftrain can reach (http or https: a file
    store or a hosted scheme is the user's process's own business)."""
    uri = env.get("MLFLOW_TRACKING_URI", "")
    return MlflowServer(env) if uri.startswith(("http://", "https://")) else None


def mlflow_run(env: Mapping[str, str], recorded: str | None, name: str) -> str | None:
    """The MLflow run every attempt of the run continues: the one the log recorded, else the user's
    `MLFLOW_RUN_ID`, else one created now on the tracking server (None without one, or when it is down: one
    line says so, and the run goes on without)."""
    if recorded or env.get("MLFLOW_RUN_ID"):
        return recorded or env.get("MLFLOW_RUN_ID")
    server = mlflow_server(env)
    if server is None:
        return None
    try:
        return server.create_run(name, int(time.time() * 1000))
    except TrackerDown as exc:
        sys.stderr.write(f"ftrain run: no MLflow run created, going on without one ({visible(str(exc))})\n")
        return None


def lifecycle_feed(env: Mapping[str, str], run_id: str, mlflow_run_id: str | None) -> TrackerFeed | None:
    """The feed of the run's lifecycle into its MLflow run, started (None without a server or a run)."""
    server = mlflow_server(env)
    if server is None or mlflow_run_id is None:
        return None
    cursors = Cursors(cursor_path(settings.home(env)))
    return TrackerFeed(run_id, MlflowTracker(server, mlflow_run_id), cursors, env).start()
