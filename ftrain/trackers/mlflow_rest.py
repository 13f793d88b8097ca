"""MLflow through its REST API (the standard library's HTTP client: the supervisor imports no `mlflow`, and a
slow or dead server costs one short timeout, never MLflow's own minutes of retries).

The server is `MLFLOW_TRACKING_URI` (http or https), reached with the credentials MLflow's client reads
(`MLFLOW_TRACKING_TOKEN`, or `MLFLOW_TRACKING_USERNAME` and `MLFLOW_TRACKING_PASSWORD`); the run goes into
`MLFLOW_EXPERIMENT_ID`, else `MLFLOW_EXPERIMENT_NAME` (created when missing), else MLflow's default one.
What ftrain sends is only what `Write` carries: never its environment or a path beyond the checkpoint URI."""

import base64
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any, Final

from ftrain.trackers.tracker_port import TrackerDown, Write

TIMEOUT_S: Final = 5.0
DEFAULT_EXPERIMENT: Final = "0"
API: Final = "/api/2.0/mlflow/"


class MlflowServer:
    """An MLflow tracking server as `env` names it."""

    def __init__(self, env: Mapping[str, str], timeout: float = TIMEOUT_S) -> None:
        self.uri = env["MLFLOW_TRACKING_URI"].rstrip("/")
        self.timeout = timeout
        self._headers = {"Content-Type": "application/json", **_auth(env)}
        self._experiment = env.get("MLFLOW_EXPERIMENT_ID"), env.get("MLFLOW_EXPERIMENT_NAME")

    def call(self, method: str, endpoint: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """One REST call; raises TrackerDown with one line saying why it failed."""
        url = f"{self.uri}{API}{endpoint}"
        data = None
        if method == "GET" and body:
            url += "?" + urllib.parse.urlencode(body)
        elif body is not None:
            data = json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, headers=self._headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                answer: dict[str, Any] = json.loads(response.read() or b"{}")
                return answer
        except urllib.error.HTTPError as exc:
            raise TrackerDown(f"MLflow {endpoint}: HTTP {exc.code} {_error_code(exc)}".rstrip()) from exc
        except (OSError, ValueError) as exc:  # URLError, timeouts, refused connections; a non-JSON answer
            raise TrackerDown(f"MLflow {endpoint}: {exc}") from exc

    def experiment_id(self) -> str:
        """The experiment runs are created in: the named one (created when missing), or MLflow's default."""
        given, name = self._experiment
        if given:
            return given
        if not name:
            return DEFAULT_EXPERIMENT
        try:
            found = self.call("GET", "experiments/get-by-name", {"experiment_name": name})
            return str(found["experiment"]["experiment_id"])
        except TrackerDown as exc:
            if "RESOURCE_DOES_NOT_EXIST" not in str(exc):
                raise
        return str(self.call("POST", "experiments/create", {"name": name})["experiment_id"])

    def create_run(self, name: str, start_ms: int) -> str:
        """A new run named `name` (the user's script continues it through `MLFLOW_RUN_ID`); its id."""
        body = {"experiment_id": self.experiment_id(), "run_name": name, "start_time": start_ms}
        try:
            return str(self.call("POST", "runs/create", body)["run"]["info"]["run_id"])
        except (KeyError, TypeError) as exc:
            raise TrackerDown(f"MLflow runs/create: unexpected answer ({exc})") from exc


class MlflowTracker:
    """ftrain's lifecycle writes into one MLflow run (`Tracker`)."""

    name = "mlflow"

    def __init__(self, server: MlflowServer, run_id: str) -> None:
        self.server = server
        self.run_id = run_id

    def write(self, write: Write) -> None:
        """One `log-batch`: the tags and the metrics at the write's step and time."""
        millis = int(write.at.timestamp() * 1000)
        self.server.call(
            "POST",
            "runs/log-batch",
            {
                "run_id": self.run_id,
                "tags": [{"key": k, "value": v} for k, v in write.tags.items()],
                "metrics": [
                    {"key": k, "value": v, "timestamp": millis, "step": write.step}
                    for k, v in write.metrics.items()
                ],
            },
        )


def _auth(env: Mapping[str, str]) -> dict[str, str]:
    """The Authorization header MLflow's own client would send, if any."""
    if token := env.get("MLFLOW_TRACKING_TOKEN"):
        return {"Authorization": f"Bearer {token}"}
    user, password = env.get("MLFLOW_TRACKING_USERNAME"), env.get("MLFLOW_TRACKING_PASSWORD")
    if user and password:
        return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}
    return {}


def _error_code(exc: urllib.error.HTTPError) -> str:
    """MLflow's `error_code` from an error answer ("" when it has none)."""
    try:
        return str(json.loads(exc.read()).get("error_code", ""))
    except (OSError, ValueError, AttributeError):
        return ""
