"""System metrics (CPU, memory, disk, network, GPU) of a training run, sent through its `RunWriter`.

MLflow's own `SystemMetricsMonitor` sends through a client of its own and stops for good at the first
failed call (it reads the run's status every sample), so an outage would end a run's system metrics.
This one keeps MLflow's samplers and aggregation and hands each sample to the writer instead: samples
wait out an outage with the run's other metrics and keep their times and steps.
"""

from __future__ import annotations

from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

from tasks.tracking.delivery.writer import RunWriter


class WriterSystemMetrics(SystemMetricsMonitor):
    """A sample every `sampling_interval` seconds as `system/...` metrics of `run`, through `writer`."""

    def __init__(
        self, writer: RunWriter, run: str, sampling_interval: float = 5, resume: bool = False
    ) -> None:
        super().__init__(run, sampling_interval=sampling_interval, tracking_uri=writer.client.tracking_uri)
        self.writer = writer
        self.run = run
        if resume:  # continue the run's system steps (a bounded read; 0 while the store is away)
            self._logging_step = writer.ask("system step", self._get_next_logging_step, run) or 0

    def monitor(self) -> None:
        while not self._shutdown_event.is_set():
            self.collect_metrics()
            if self._shutdown_event.wait(self.sampling_interval):
                return
            self.publish_metrics(self.aggregate_metrics())

    def publish_metrics(self, metrics: dict[str, float]) -> None:
        prefix = self._metrics_prefix + (f"{self.node_id}/" if self.node_id else "")
        self.writer.log_metrics(self.run, {prefix + k: v for k, v in metrics.items()}, self._logging_step)
        self._logging_step += 1
        for monitor in self.monitors:
            monitor.clear_metrics()

    def finish(self, seconds: float = 30.0) -> None:
        """Stop sampling (a sampler stuck in a system call is left after `seconds`)."""
        self._shutdown_event.set()
        if self._process is not None:
            self._process.join(seconds)
        self._process = None
