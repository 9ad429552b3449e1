"""A completions server's figures in Prometheus' text format (`GET /metrics`): requests by endpoint and
status, prompt and generated tokens, the queue, the running batch, each step's batch, time to first
token and time per output token. One registry per server, so two servers in a process never mix."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gptcore.serving.sequence import Sequence

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class ServerMetrics:
    def __init__(self, waiting: Callable[[], int], running: Callable[[], int]) -> None:
        self.registry = CollectorRegistry()
        on = {"registry": self.registry}
        self.requests = Counter(
            "gptpipe_requests", "requests answered, by endpoint and status", ["endpoint", "status"], **on
        )
        self.prompt_tokens = Counter("gptpipe_prompt_tokens", "prompt tokens of the sequences decoded", **on)
        self.generated_tokens = Counter("gptpipe_generated_tokens", "tokens generated", **on)
        queue = Gauge("gptpipe_queue_length", "sequences waiting for a row in the batch", **on)
        queue.set_function(waiting)
        batch = Gauge("gptpipe_running_batch_size", "sequences in the running batch", **on)
        batch.set_function(running)
        self.step_batch = Histogram(
            "gptpipe_decode_step_batch_size", "sequences each decode step ran", buckets=BATCH_BUCKETS, **on
        )
        self.step_seconds = Histogram(
            "gptpipe_decode_step_seconds", "seconds of each decode step", buckets=LATENCY_BUCKETS, **on
        )
        self.first_token = Histogram(
            "gptpipe_time_to_first_token_seconds", "from a request's arrival to its first token",
            buckets=LATENCY_BUCKETS, **on,
        )  # fmt: skip
        self.per_token = Histogram(
            "gptpipe_time_per_output_token_seconds", "a sequence's seconds per token after its first",
            buckets=LATENCY_BUCKETS, **on,
        )  # fmt: skip

    def stepped(self, batch: int, seconds: float) -> None:
        """The decode loop's observer (`gptcore.serving.scheduler.Observer`)."""
        self.step_batch.observe(batch)
        self.step_seconds.observe(seconds)

    def sequence_ended(self, sequence: Sequence) -> None:
        self.prompt_tokens.inc(len(sequence.prompt_ids))
        self.generated_tokens.inc(len(sequence.generated))
        if sequence.first_token_at is not None:
            self.first_token.observe(sequence.first_token_at - sequence.submitted_at)
            if sequence.finished_at is not None and len(sequence.generated) > 1:
                after_first = sequence.finished_at - sequence.first_token_at
                self.per_token.observe(after_first / (len(sequence.generated) - 1))

    def text(self) -> bytes:
        return generate_latest(self.registry)
