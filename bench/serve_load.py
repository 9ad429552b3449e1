"""Load on `gptpipe serve`: many clients at once against batched decoding, beside the in-process ceiling.

Starts `gptpipe serve --model MODEL` on a free loopback port, then for each number of concurrent clients
(`--clients 1,8,32,64`) and each completion length (`--new-tokens 20,200`) keeps that many clients
sending `POST /v1/completions` (one prompt, greedy, `max_tokens` new tokens; each client sends its next
request when its last is answered) for `--seconds`, and prints a row: aggregate requests/s and
tokens/s, p50 and p99 latency, the mean time to first token and the mean decode batch (both from the
server's `/metrics`, as deltas over the measured window). Beside the rows, the ceiling: the same model in
this process decoding `--ceiling-batch` prompts together with the server's own decoder, no HTTP.

The clients run in this process's event loop (httpx), on the same cores as the server: the figures are
what one machine serving itself gets, and the ratio column (tokens/s over the one-client row) compares
rows of the same run. Run after `make run` (which registers `gptpipe-iteration-1@champion`):

    .venv/bin/python bench/serve_load.py [--model models:/gptpipe-iteration-1@champion] [--seconds 15]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROMPTS = [
    "def main(",
    "import os\n",
    "class Config:",
    "for item in ",
    "    return ",
    "# the ",
    "if __name__",
    "with open(",
]


@dataclass
class Row:
    clients: int
    new_tokens: int
    requests: int
    seconds: float
    latencies: list[float]
    tokens: int
    first_token_mean: float
    batch_mean: float

    def cells(self, reference: float | None) -> list[str]:
        latencies = sorted(self.latencies)
        p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
        rate = self.tokens / self.seconds
        ratio = f"{rate / reference:.2f}" if reference else "1.00"
        counts = [
            str(self.clients),
            str(self.new_tokens),
            f"{self.requests / self.seconds:.1f}",
            f"{rate:.0f}",
        ]
        times = [f"{statistics.median(latencies):.3f}", f"{p99:.3f}", f"{self.first_token_mean:.3f}"]
        return [*counts, ratio, *times, f"{self.batch_mean:.1f}"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def server_figures(metrics: str) -> dict[str, float]:
    """The sums and counts this bench reads from the server's Prometheus text."""
    wanted = {}
    for line in metrics.splitlines():
        name, _, value = line.partition(" ")
        if name in (
            "gptpipe_time_to_first_token_seconds_sum", "gptpipe_time_to_first_token_seconds_count",
            "gptpipe_decode_step_batch_size_sum", "gptpipe_decode_step_batch_size_count",
        ):  # fmt: skip
            wanted[name] = float(value)
    return wanted


def mean_of(before: dict[str, float], after: dict[str, float], name: str) -> float:
    count = after[f"{name}_count"] - before[f"{name}_count"]
    return (after[f"{name}_sum"] - before[f"{name}_sum"]) / count if count else float("nan")


async def load(url: str, clients: int, new_tokens: int, seconds: float) -> Row:
    import httpx

    async with httpx.AsyncClient(
        base_url=url, timeout=300, limits=httpx.Limits(max_connections=clients + 4)
    ) as http:
        before = server_figures((await http.get("/metrics")).text)
        latencies: list[float] = []
        tokens = 0
        stop_at = time.perf_counter() + seconds

        async def client(index: int) -> None:
            nonlocal tokens
            sent = 0
            while time.perf_counter() < stop_at:
                prompt = PROMPTS[(index + sent) % len(PROMPTS)]
                body = {"prompt": prompt, "max_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
                started = time.perf_counter()
                answer = await http.post("/v1/completions", json=body)
                answer.raise_for_status()
                latencies.append(time.perf_counter() - started)
                tokens += answer.json()["usage"]["completion_tokens"]
                sent += 1

        started = time.perf_counter()
        await asyncio.gather(*(client(index) for index in range(clients)))
        elapsed = time.perf_counter() - started
        after = server_figures((await http.get("/metrics")).text)
    first = mean_of(before, after, "gptpipe_time_to_first_token_seconds")
    batch = mean_of(before, after, "gptpipe_decode_step_batch_size")
    return Row(clients, new_tokens, len(latencies), elapsed, latencies, tokens, first, batch)


def ceiling(model: str, batch: int, new_tokens: int) -> float:
    """Tokens/s of the server's decoder in this process: `batch` prompts decoded together."""
    import torch

    from gptcore.export.model_files import model_files_at
    from gptcore.serving.decoder import BatchDecoder
    from gptcore.serving.sequence import Sampling, Sequence
    from gptcore.serving.served import load_served

    torch.set_num_threads(os.cpu_count() or 1)
    served = load_served(model_files_at(Path(model)), model)
    decoder = BatchDecoder(served.model, batch)
    best = 0.0
    for _ in range(3):
        greedy = Sampling(max_tokens=new_tokens, temperature=0)
        prompts = [served.encode(PROMPTS[i % len(PROMPTS)]) for i in range(batch)]
        sequences = [Sequence(ids, greedy, served.tokenizer) for ids in prompts]
        started = time.perf_counter()
        for sequence in sequences:
            decoder.add(sequence)
        while decoder.running:
            decoder.step()
        best = max(best, sum(len(s.generated) for s in sequences) / (time.perf_counter() - started))
    return best


def local_model(model: str, scratch: Path) -> str:
    """A folder holding the model's files (a logged model downloaded once), so the ceiling reads the same."""
    if Path(model).is_dir():
        return model
    from tasks.params.loading import load_params
    from tasks.tracking.models.model_uri import model_files_of

    files = model_files_of(
        model, load_params(str(REPO / "params" / "iteration_1.yaml"), []).tracking, into=scratch
    )
    return str(files.weights.parent)


def main() -> None:
    import tempfile

    import httpx

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models:/gptpipe-iteration-1@champion")
    parser.add_argument("--clients", default="1,8,32,64")
    parser.add_argument("--new-tokens", default="20,200")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--ceiling-batch", type=int, default=32)
    args = parser.parse_args()
    scratch = tempfile.TemporaryDirectory(prefix="gptpipe-serve-load-")
    model = local_model(args.model, Path(scratch.name))
    port = free_port()
    gptpipe = Path(sys.executable).with_name("gptpipe")
    server = subprocess.Popen(
        [str(gptpipe), "serve", "--model", model, "--port", str(port), "--max-batch", "64"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    rows: list[Row] = []
    try:
        started = time.perf_counter()
        while True:
            try:
                httpx.get(f"{url}/health", timeout=2).raise_for_status()
                break
            except httpx.HTTPError:
                if server.poll() is not None or time.perf_counter() - started > 120:
                    raise SystemExit("the server did not come up") from None
                time.sleep(0.25)
        for new_tokens in (int(n) for n in args.new_tokens.split(",")):
            asyncio.run(load(url, 1, new_tokens, 2.0))  # warm up
            for clients in (int(c) for c in args.clients.split(",")):
                rows.append(asyncio.run(load(url, clients, new_tokens, args.seconds)))
                print(
                    json.dumps({"clients": clients, "new_tokens": new_tokens, "done": True}), file=sys.stderr
                )
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    headers = [
        "clients",
        "new tokens",
        "requests/s",
        "tokens/s",
        "x 1 client",
        "p50 s",
        "p99 s",
        "mean TTFT s",
        "mean batch",
    ]
    print("| " + " | ".join(headers) + " |")
    print("|" + "---|" * len(headers))
    for row in rows:
        reference = next(r for r in rows if r.new_tokens == row.new_tokens)
        print("| " + " | ".join(row.cells(reference.tokens / reference.seconds)) + " |")
    for new_tokens in (int(n) for n in args.new_tokens.split(",")):
        best = ceiling(model, args.ceiling_batch, new_tokens)
        served = [r for r in rows if r.new_tokens == new_tokens and r.clients == args.ceiling_batch]
        batch = args.ceiling_batch
        share = f"; the server at {batch} clients: {served[0].tokens / served[0].seconds / best:.0%} of it"
        line = f"ceiling, {new_tokens} new tokens: {best:.0f} tokens/s decoding {batch} prompts in process"
        print(line + (share if served else ""))
    scratch.cleanup()


if __name__ == "__main__":
    main()
