"""The MLflow side of a training run: a `TrainingCallback` that records it under the run-record names.

Metrics go through `MetricQueue`, a background thread that batches them into `log_batch` calls, so a
training step never waits on the store. A failing call is retried with backoff and counted; training
goes on whatever the store does, and the counts are reported (stderr and run tags) at the end.
Every call names its run id: MLflow's active run is per thread, and Prefect runs tasks on worker threads.

A resumed training continues its own run: the run id travels in each checkpoint's metadata
(`self.metadata`, which the trainer writes into every checkpoint record), and `open` finds it again
from the checkpoint a resume starts from.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gptcore.callbacks import TrainingCallback
from gptcore.records import END_METRICS, EVAL_METRICS, STEP_METRICS, finite_metrics, startup_params
from tasks.tracking_store import redact

RUN_ID_KEY = "mlflow_run_id"
_MAX_PARAMS_PER_CALL = 100  # MLflow's log_batch limits
_MAX_METRICS_PER_CALL = 1000


class Resilient:
    """Calls into the store, each retried with backoff; failed attempts and given-up calls counted."""

    def __init__(self, retries: int = 3, backoff_seconds: float = 0.5) -> None:
        self.retries = retries
        self.backoff_seconds = backoff_seconds
        self.failed_calls = 0  # attempts that raised
        self.given_up_calls = 0  # calls still failing after every retry
        self.last_error = ""
        self._lock = threading.Lock()

    def call(self, what: str, function: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
        for attempt in range(self.retries + 1):
            try:
                function(*args, **kwargs)
                return True
            except Exception as error:  # the store may fail in any way; training must not
                with self._lock:
                    self.failed_calls += 1
                    self.last_error = f"{what}: {redact(str(error).splitlines()[0] if str(error) else error)}"
                if attempt < self.retries:
                    time.sleep(self.backoff_seconds * 2**attempt)
        with self._lock:
            self.given_up_calls += 1
        return False


class MetricQueue:
    """Metrics logged from a background thread in batches, at most every `flush_seconds`."""

    def __init__(self, client: Any, run_id: str, calls: Resilient, flush_seconds: float = 1.0) -> None:
        self.client = client
        self.run_id = run_id
        self.calls = calls
        self.flush_seconds = flush_seconds
        self.sent_batches = 0
        self.sent_metrics = 0
        self.dropped_metrics = 0
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=f"mlflow-metrics-{run_id[:8]}", daemon=True)
        self._thread.start()

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        for key, value in metrics.items():
            self._queue.put(Metric(key, value, stamp, step))

    def _work(self) -> None:
        pending: list[Any] = []
        deadline = time.monotonic() + self.flush_seconds
        while True:
            try:
                item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                item = None
            if item is not None and item is not _STOP:
                pending.append(item)
            if pending and (item is None or item is _STOP or len(pending) >= _MAX_METRICS_PER_CALL):
                self._send(pending)
                pending = []
            if item is None:
                deadline = time.monotonic() + self.flush_seconds
            if item is _STOP:
                return

    def _send(self, batch: list[Any]) -> None:
        if self.calls.call("log_batch", self.client.log_batch, self.run_id, metrics=batch):
            self.sent_batches += 1
            self.sent_metrics += len(batch)
        else:
            self.dropped_metrics += len(batch)

    def close(self, timeout: float = 60.0) -> None:
        """Send what is queued and stop the thread."""
        self._queue.put(_STOP)
        self._thread.join(timeout)


_STOP = object()


class MLflowCallback(TrainingCallback):
    """Records one training run in MLflow: params at start, metrics per interval and evaluation,
    end figures, the final and best checkpoints as artifacts, the latest checkpoint path as a tag."""

    def __init__(
        self,
        client: Any,
        tracking_uri: str,
        experiment_id: str,
        run_name: str,
        *,
        run_id: str | None = None,
        parent_run_id: str | None = None,
        tags: dict[str, str] | None = None,
        params: dict[str, Any] | None = None,
        artifacts: list[Path] | None = None,
        system_metrics: bool = True,
        log_checkpoints: bool = True,
        flush_seconds: float = 1.0,
        retries: int = 3,
        backoff_seconds: float = 0.5,
        stream: Any = None,
    ) -> None:
        self.client = client
        self.tracking_uri = tracking_uri
        self.experiment_id = experiment_id
        self.run_name = run_name
        self.run_id = run_id
        self.parent_run_id = parent_run_id
        self.tags = dict(tags or {})
        self.params = dict(params or {})
        self.artifacts = list(artifacts or [])
        self.system_metrics = system_metrics
        self.log_checkpoints = log_checkpoints
        self.flush_seconds = flush_seconds
        self.calls = Resilient(retries, backoff_seconds)
        self.stream = stream
        # The trainer writes this dict into every checkpoint record (TrainJob.metadata): pass it there.
        self.metadata: dict[str, Any] = {}
        self.continued = False
        self.checkpoints: dict[str, Path] = {}
        self.report: dict[str, Any] = {}
        self._metrics: MetricQueue | None = None
        self._monitor: Any = None
        self._closed = False

    # --- the run ----------------------------------------------------------------------------------

    def _prior_run(self, resumed_from: str | Path | None) -> str | None:
        """The run a resumed checkpoint was recorded in, when that run is in this store."""
        if not resumed_from:
            return None
        from gptcore.checkpoint import checkpoint_metadata

        try:
            prior = checkpoint_metadata(Path(resumed_from)).get("metadata", {}).get(RUN_ID_KEY)
        except Exception:  # an unreadable record: the trainer itself reports it
            return None
        if not prior:
            return None
        try:
            self.client.get_run(prior)
        except Exception:
            return None  # a checkpoint from another store: start a fresh run
        return prior

    def open(self, resumed_from: str | Path | None = None) -> str:
        """Decide the run (continue the checkpoint's, use the given one, or create one); idempotent."""
        if self.metadata.get(RUN_ID_KEY):
            return self.metadata[RUN_ID_KEY]
        prior = self._prior_run(resumed_from)
        if prior is not None:
            if self.run_id and self.run_id != prior:
                # The caller's run (a pipeline stage's child) points at the line training continues.
                self.calls.call("set_tag", self.client.set_tag, self.run_id, "continued_run_id", prior)
            self.client.update_run(prior, status="RUNNING")
            self.run_id, self.continued = prior, True
        elif self.run_id is None:
            tags = {"mlflow.runName": self.run_name, **self.tags}
            if self.parent_run_id:
                tags["mlflow.parentRunId"] = self.parent_run_id
            run = self.client.create_run(self.experiment_id, run_name=self.run_name, tags=_clean_tags(tags))
            self.run_id = run.info.run_id
        self.metadata.update({RUN_ID_KEY: self.run_id, "mlflow_tracking_uri": redact(self.tracking_uri)})
        return self.run_id

    def _log_params(self, values: dict[str, Any]) -> None:
        from mlflow.entities import Param

        existing: dict[str, str] = {}
        if self.continued:
            try:
                existing = self.client.get_run(self.run_id).data.params
            except Exception:
                existing = {}
        fresh = [Param(k, redact(v)[:6000]) for k, v in values.items() if k not in existing]
        for start in range(0, len(fresh), _MAX_PARAMS_PER_CALL):
            chunk = fresh[start : start + _MAX_PARAMS_PER_CALL]
            self.calls.call("log_params", self.client.log_batch, self.run_id, params=chunk)

    def _set_tags(self, tags: dict[str, Any]) -> None:
        from mlflow.entities import RunTag

        batch = [RunTag(k, v) for k, v in _clean_tags(tags).items()]
        if batch:
            self.calls.call("set_tags", self.client.log_batch, self.run_id, tags=batch)

    def _start_system_metrics(self) -> None:
        if not self.system_metrics:
            return
        try:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            self._monitor = SystemMetricsMonitor(
                self.run_id,
                sampling_interval=5,
                resume_logging=self.continued,
                tracking_uri=self.tracking_uri,
            )
            self._monitor.start()
        except Exception as error:  # psutil missing or the like: training goes on without
            self.calls.last_error = f"system metrics: {error}"
            self._monitor = None

    # --- TrainingCallback --------------------------------------------------------------------------

    def on_start(self, startup: dict[str, Any]) -> None:
        self.open(startup.get("resumed_from"))
        self._log_params({**startup_params(startup), **self.params})
        self._set_tags(
            {
                "checkpoint_directory": startup.get("checkpoint_directory"),
                "start_step": startup.get("start_step", 0),
                "resumed_from": startup.get("resumed_from"),
                "dry_run": startup.get("dry_run", False),
                **({} if self.continued else self.tags),
            }
        )
        for path in self.artifacts:
            self._log_artifact(Path(path), "inputs")
        self._metrics = MetricQueue(self.client, self.run_id, self.calls, self.flush_seconds)
        self._start_system_metrics()

    def on_step(self, metrics: dict[str, Any]) -> None:
        if self._metrics is not None:
            self._metrics.log(finite_metrics(metrics, STEP_METRICS), int(metrics.get("step", 0)))

    def on_eval(self, metrics: dict[str, Any]) -> None:
        if self._metrics is not None:
            self._metrics.log(finite_metrics(metrics, EVAL_METRICS), int(metrics.get("step", 0)))

    def on_checkpoint(self, path: Path, info: dict[str, Any]) -> None:
        kind = info.get("kind", "step")
        self.checkpoints["latest" if kind == "step" else kind] = Path(path)
        self.checkpoints["newest"] = Path(path)
        self._set_tags({"latest_checkpoint": str(Path(path).resolve())})

    def on_end(self, summary: dict[str, Any]) -> None:
        if self._metrics is not None:
            self._metrics.log(finite_metrics(summary, END_METRICS), int(summary.get("steps", 0)))
        if self.log_checkpoints:
            for kind in ("final", "best"):
                if kind in self.checkpoints:
                    self._log_checkpoint(self.checkpoints[kind], kind)
        self._finish("FINISHED", {})

    def on_failure(self, reason: str) -> None:
        if self.run_id is None:
            return  # failed before the run opened (bad input): nothing to record
        self._finish("FAILED", {"failure_reason": reason[:5000]})

    # --- the end ------------------------------------------------------------------------------------

    def _log_artifact(self, path: Path, folder: str) -> None:
        if path.is_file():
            self.calls.call("log_artifact", self.client.log_artifact, self.run_id, str(path), folder)

    def _log_checkpoint(self, path: Path, kind: str) -> None:
        self._log_artifact(path, f"checkpoints/{kind}")
        self._log_artifact(path.with_suffix(".json"), f"checkpoints/{kind}")

    def _finish(self, status: str, tags: dict[str, Any]) -> None:
        if self._closed:
            return
        self._closed = True
        if self._monitor is not None:
            self._monitor.finish()
        if self._metrics is not None:
            self._metrics.close()
        calls, metrics = self.calls, self._metrics
        self.report = {
            "run_id": self.run_id,
            "status": status,
            "failed_calls": calls.failed_calls,
            "given_up_calls": calls.given_up_calls,
            "sent_metrics": metrics.sent_metrics if metrics else 0,
            "dropped_metrics": metrics.dropped_metrics if metrics else 0,
            "last_error": calls.last_error,
        }
        self._set_tags(
            {
                **tags,
                "tracking.failed_calls": calls.failed_calls,
                "tracking.dropped_metrics": self.report["dropped_metrics"],
            }
        )
        self.calls.call("set_terminated", self.client.set_terminated, self.run_id, status)
        if calls.failed_calls:
            print(
                f"warning: MLflow run {self.run_id}: {calls.failed_calls} logging calls failed and were "
                f"retried, {calls.given_up_calls} given up ({self.report['dropped_metrics']} metric values "
                f"lost); last error: {calls.last_error}",
                file=self.stream or sys.stderr,
                flush=True,
            )


def _clean_tags(tags: dict[str, Any]) -> dict[str, str]:
    """Tags as redacted strings; None values left out (MLflow tags are text)."""
    return {k: redact(v)[:8000] for k, v in tags.items() if v is not None}
