"""A completions server's figures in Prometheus' text format (`GET /metrics`): requests by endpoint and
status, prompt and generated tokens, the queue, the running batch, each step's decode batch and seconds,
its prefill's seconds and tokens, time to first token and time per output token. One registry per
server, so two servers in a process never mix."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gptcore.serving.decoder import StepReport
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
            "gptpipe_decode_step_seconds",
            "seconds of each step's pass (its decoding rows and the prompts packed with them)",
            buckets=LATENCY_BUCKETS,
            **on,
        )
        self.prefill_seconds = Histogram(
            "gptpipe_prefill_seconds", "seconds of each chunk of a long prompt, in a pass of its own",
            buckets=LATENCY_BUCKETS, **on,
        )  # fmt: skip
        self.prefill_tokens = Counter("gptpipe_prefilled_tokens", "prompt tokens run through the model", **on)
        self.first_token = Histogram(
            "gptpipe_time_to_first_token_seconds", "from a request's arrival to its first token",
            buckets=LATENCY_BUCKETS, **on,
        )  # fmt: skip
        self.per_token = Histogram(
            "gptpipe_time_per_output_token_seconds", "a sequence's seconds per token after its first",
            buckets=LATENCY_BUCKETS, **on,
        )  # fmt: skip

    def stepped(self, report: StepReport) -> None:
        """The decode loop's observer (`gptcore.serving.scheduler.Observer`)."""
        self.generated_tokens.inc(report.tokens)  # as they are made: a rate over a window is exact
        if report.decoded:
            self.step_batch.observe(report.decoded)
            self.step_seconds.observe(report.decode_seconds)
        self.prefill_tokens.inc(report.prefill_tokens)
        if report.prefill_seconds:  # a long prompt's chunk, in a pass of its own
            self.prefill_seconds.observe(report.prefill_seconds)

    def sequence_ended(self, sequence: Sequence) -> None:
        self.prompt_tokens.inc(len(sequence.prompt_ids))
        if sequence.first_token_at is not None:
            self.first_token.observe(sequence.first_token_at - sequence.submitted_at)
            if sequence.finished_at is not None and len(sequence.generated) > 1:
                after_first = sequence.finished_at - sequence.first_token_at
                self.per_token.observe(after_first / (len(sequence.generated) - 1))

    def text(self) -> bytes:
        return generate_latest(self.registry)
