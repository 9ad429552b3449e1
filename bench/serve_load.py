"""Load on `gptpipe serve`: many clients at once against batched decoding, beside the model's ceiling.

Starts `gptpipe serve --model MODEL` on a free loopback port, then for each number of concurrent clients
(`--clients 1,8,32,64,128,256`) and each completion length (`--new-tokens 20,200`) keeps that many clients
sending `POST /v1/completions` (one prompt, greedy, `max_tokens` new tokens; each client sends its next
request when its last is answered). The clients run in `--client-processes` processes of their own
(`bench/load_clients.py`: hand-written keep-alive HTTP, a few tens of microseconds a request), so a row
measures the server. A row is measured in `--rounds` stretches (`--seconds` in all, each after
`--warmup` seconds of the same load), each right after a two-second window of the ceiling: machines
drift, and a share of the ceiling compares figures taken seconds apart. A row says: aggregate requests/s
and tokens/s (the server's own count of the tokens it made in the window), the share of the ceiling
(median and spread of the rounds), p50 and p99 latency, the mean time to first token, the mean decode
batch and the mean pass (the last three from the server's `/metrics`, as deltas), the requests refused
(429), and the CPU the clients spent and the CPU spent by anything that is neither server nor clients
nor this bench (read from /proc): a row beside other work says so. A crowd (more clients than the
server's `--max-batch`) is also set against the best row so far: each of its rounds comes right after a
round of the best row's clients, and the crowd's line prints the median and spread of those pairs.

The ceiling is the server's own decoder in this process with nothing else running: `--ceiling-batch`
sequences decoding, each replaced as it ends. Before the rows it is measured over two-second windows
until three in a row agree within 3%, printed as their median and spread, with the passes that decoded
alone apart from those that took prompts in.

`--long-prompt 2000` adds the long-prompt case: the same architecture with a window of 2,048 tokens
(random weights: time does not depend on them), 32 streaming clients decoding, and one prompt of that many
tokens arriving among them: their largest gap between two tokens while it goes in, beside their median
gap, with the server's token budget per step and with a budget past the prompt (one piece). Run after
`make run` (which registers the champion):

    .venv/bin/python bench/serve_load.py [--model models:/gptpipe-iteration-1@champion] [--seconds 12]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import multiprocessing
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from load_clients import PROMPTS, Load, Measured, serve_clients

REPO = Path(__file__).resolve().parents[1]
TICKS = os.sysconf("SC_CLK_TCK")


# --- CPU, from /proc ----------------------------------------------------------------------------------


def machine_busy() -> float:
    """CPU seconds every core has spent busy since boot (all but idle and iowait)."""
    fields = [int(value) for value in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / TICKS


def process_cpu(pid: int) -> float:
    """CPU seconds a process (all its threads) has spent, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


@dataclass
class CpuShare:
    """Who spent the machine's CPU over a span: the server, this bench, everything else."""

    busy: float
    server: float
    bench: float

    @staticmethod
    def now(server_pid: int) -> CpuShare:
        return CpuShare(machine_busy(), process_cpu(server_pid), process_cpu(os.getpid()))

    def others(self, later: CpuShare, clients: float) -> float:
        """Seconds of CPU neither the server, nor the clients, nor this bench spent."""
        ours = (later.server - self.server) + (later.bench - self.bench) + clients
        return max(0.0, (later.busy - self.busy) - ours)


# --- the server and its figures -----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def running_server(model: str, extra: list[str]) -> Iterator[tuple[str, subprocess.Popen]]:
    """`gptpipe serve` on a free loopback port, until the block ends (SIGTERM)."""
    import httpx

    port = free_port()
    gptpipe = Path(sys.executable).with_name("gptpipe")
    command = [str(gptpipe), "serve", "--model", model, "--port", str(port), *extra]
    server = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    started = time.perf_counter()
    try:
        while True:
            try:
                httpx.get(f"{url}/health", timeout=2).raise_for_status()
                break
            except httpx.HTTPError:
                if server.poll() is not None or time.perf_counter() - started > 120:
                    raise SystemExit(f"the server did not come up: {server.stderr.read().decode()}") from None
                time.sleep(0.25)
        yield url, server
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)


SUMMED = (
    "gptpipe_time_to_first_token_seconds",
    "gptpipe_decode_step_batch_size",
    "gptpipe_decode_step_seconds",
    "gptpipe_prefill_seconds",
)


def server_figures(url: str) -> dict[str, float]:
    """The sums and counts this bench reads from the server's Prometheus text."""
    import httpx

    wanted = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        name, _, value = line.partition(" ")
        if (
            name.removesuffix("_sum").removesuffix("_count") in SUMMED
            or name == "gptpipe_generated_tokens_total"
        ):
            wanted[name] = float(value)
    return wanted


def delta(before: dict[str, float], after: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


# --- a row --------------------------------------------------------------------------------------------


@dataclass
class Round:
    """One stretch of a row: the clients' load on the server, beside the decoder alone just before."""

    seconds: float
    measured: list[Measured]
    figures: dict[str, float]  # the server's sums and counts over the stretch (deltas)
    ceiling: float  # tokens/s of the decoder alone, the window just before
    client_cpu: float  # cores the client processes kept busy
    other_cpu: float  # cores anything else kept busy
    reference: float = float("nan")  # a crowd's: tokens/s of the best row's clients, the round just before

    @property
    def tokens_per_second(self) -> float:
        """The server's own count of the tokens it made in the window (a client learns a request's
        tokens only at its end: a long request's share of the window would be a guess)."""
        return self.figures.get("gptpipe_generated_tokens_total", 0.0) / self.seconds


@dataclass
class Row:
    clients: int
    new_tokens: int
    rounds: list[Round]
    against: int = 0  # a crowd's: the clients of the best row before it, measured again beside it

    def total(self, name: str) -> float:
        return sum(r.figures.get(name, 0.0) for r in self.rounds)

    def mean(self, name: str) -> float:
        count = self.total(f"{name}_count")
        return self.total(f"{name}_sum") / count if count else float("nan")

    @property
    def seconds(self) -> float:
        return sum(r.seconds for r in self.rounds)

    @property
    def tokens_per_second(self) -> float:
        return sum(r.tokens_per_second * r.seconds for r in self.rounds) / self.seconds

    @property
    def of_ceiling(self) -> list[float]:
        """Each round's tokens/s over the decoder alone in the window just before it."""
        return sorted(r.tokens_per_second / r.ceiling for r in self.rounds)

    @property
    def of_best(self) -> list[float]:
        """A crowd's rounds over the best row's clients measured in the round just before each: the
        crowd set against the best row on the same seconds of the same machine."""
        return sorted(r.tokens_per_second / r.reference for r in self.rounds)

    def percentile(self, share: float) -> float:
        latencies = sorted(x for r in self.rounds for m in r.measured for x in m.latencies)
        return latencies[min(len(latencies) - 1, int(share * len(latencies)))] if latencies else float("nan")

    def cells(self, one_client: float) -> list[str]:
        rate, ratios = self.tokens_per_second, self.of_ceiling
        requests = sum(m.requests_in_window for r in self.rounds for m in r.measured) / self.seconds
        return [
            str(self.clients), str(self.new_tokens), f"{requests:.1f}", f"{rate:,.0f}",
            f"{rate / one_client:.2f}",
            f"{statistics.median(ratios):.0%} ({ratios[0]:.0%}-{ratios[-1]:.0%})",
            f"{self.percentile(0.5):.3f}", f"{self.percentile(0.99):.3f}",
            f"{self.mean('gptpipe_time_to_first_token_seconds'):.3f}",
            f"{self.mean('gptpipe_decode_step_batch_size'):.1f}",
            f"{1000 * self.mean('gptpipe_decode_step_seconds'):.1f}",
            str(sum(m.refused for r in self.rounds for m in r.measured)),
            f"{max(r.client_cpu for r in self.rounds):.2f}", f"{max(r.other_cpu for r in self.rounds):.2f}",
        ]  # fmt: skip


HEADERS = [
    "clients", "new tokens", "requests/s", "tokens/s", "x 1 client", "of ceiling (rounds)", "p50 s", "p99 s",
    "mean TTFT s", "mean batch", "pass ms", "refused", "client CPU", "other CPU",
]  # fmt: skip


def start_clients(
    port: int, clients: int, new_tokens: int, processes: int, at: float, window: tuple[float, float]
) -> list:
    """`clients` clients in `processes` processes, sending from `at`; each measures `window`."""
    context = multiprocessing.get_context("fork")
    workers, first = [], 0
    for index in range(processes):
        share = clients // processes + (index < clients % processes)
        load = Load("127.0.0.1", port, share, first, new_tokens, at, *window)
        first += share
        receiving, sending = context.Pipe(duplex=False)
        process = context.Process(target=serve_clients, args=(load, sending), daemon=True)
        process.start()
        workers.append((process, receiving))
    return workers


def measure_round(url: str, server: subprocess.Popen, clients: int, new_tokens: int, ceiling: float,
                  args: argparse.Namespace, cycle: float) -> Round:  # fmt: skip
    """One stretch of load: `--warmup` s, then `--seconds / --rounds` measured; both at least `cycle`,
    the time every client takes to be answered once, so a queue past the batch is full and its
    latencies counted."""
    seconds = max(args.seconds / args.rounds, cycle)
    start = time.time() + 0.5  # every process has connected by then
    measure_from = start + max(args.warmup, cycle)
    stop = measure_from + seconds
    port = int(url.rsplit(":", 1)[1])
    workers = start_clients(
        port, clients, new_tokens, min(args.client_processes, clients), start, (measure_from, stop)
    )
    time.sleep(max(0.0, measure_from - time.time()))
    before, cpu_before = server_figures(url), CpuShare.now(server.pid)
    time.sleep(max(0.0, stop - time.time()))
    after, cpu_after = server_figures(url), CpuShare.now(server.pid)
    measured = [receiving.recv() for _, receiving in workers]
    for process, _ in workers:
        process.join()
    run_seconds = time.time() - start
    failures = [failure for m in measured for failure in m.failed]
    if failures:
        raise SystemExit(f"{len(failures)} requests failed; the first: {failures[0]}")
    client_cpu = sum(m.cpu_seconds for m in measured)
    # The clients' CPU over the window is taken as their run's average: they do the same all run long.
    others = cpu_before.others(cpu_after, client_cpu * seconds / run_seconds)
    figures = {name: delta(before, after, name) for name in after}
    return Round(seconds, measured, figures, ceiling, client_cpu / run_seconds, others / seconds)


# --- the ceiling --------------------------------------------------------------------------------------


@dataclass
class Window:
    """One measured stretch of the decoder alone: what it made and where its time went."""

    tokens: int = 0
    seconds: float = 0.0
    decoding_seconds: float = 0.0  # passes that decoded alone
    decoding_passes: int = 0
    joined_seconds: float = 0.0  # passes that packed prompts with the decoding rows
    joined_passes: int = 0
    prompt_tokens: int = 0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds


class Ceiling:
    """The server's own decoder in this process, nothing else running: `batch` sequences of `new_tokens`
    new tokens each, every one replaced by a new one as it ends (the steady state of `batch` clients
    whose next request is already there)."""

    def __init__(self, model: str, batch: int) -> None:
        import torch

        from gptcore.export.model_files import model_files_at
        from gptcore.serving.decoder import BatchDecoder
        from gptcore.serving.served import load_served

        torch.set_num_threads(os.cpu_count() or 1)
        self.served = load_served(model_files_at(Path(model)), model)
        self.decoder = BatchDecoder(self.served.model, batch)
        self.batch = batch
        self.made = 0

    def window(self, new_tokens: int, seconds: float) -> Window:
        """Tokens made over `seconds`. The batch starts staggered, the sequences a different way from
        their ends (the first fill's lengths spread from 1 to `new_tokens`), as independent clients'
        are: started together, they would end together and join together, one wave of prompts every
        `new_tokens` passes where clients' prompts join a few at every pass."""
        from gptcore.serving.sequence import Sampling, Sequence

        greedy = Sampling(max_tokens=new_tokens, temperature=0)
        for sequence in self.decoder.sequences:  # left from the last window: ended, not counted
            sequence.finish("cancelled")
        self.decoder.drop_finished()
        spread = [
            Sampling(max_tokens=1 + i * new_tokens // self.batch, temperature=0) for i in range(self.batch)
        ]
        window = Window()
        started = time.perf_counter()
        until = started + seconds
        while time.perf_counter() < until:
            prompts = [PROMPTS[(self.made + i) % len(PROMPTS)] for i in range(self.decoder.free)]
            self.made += len(prompts)
            lengths = [spread.pop() if spread else greedy for _ in prompts]
            self.decoder.admit(
                [
                    Sequence(self.served.encode(p), n, self.served.tokenizer)
                    for p, n in zip(prompts, lengths, strict=True)
                ]
            )
            report = self.decoder.step()
            window.tokens += report.tokens
            window.prompt_tokens += report.prefill_tokens
            if report.prefill_tokens:
                window.joined_seconds += report.decode_seconds + report.prefill_seconds
                window.joined_passes += 1
            else:
                window.decoding_seconds += report.decode_seconds
                window.decoding_passes += 1
        window.seconds = time.perf_counter() - started
        return window

    def steady(self, new_tokens: int, seconds: float = 2.0, most: int = 12) -> list[Window]:
        """Windows after a warm-up one, until the last three agree within 3% (at most `most`)."""
        self.window(new_tokens, seconds)
        windows: list[Window] = []
        while len(windows) < most:
            windows.append(self.window(new_tokens, seconds))
            last = [w.tokens_per_second for w in windows[-3:]]
            if len(last) == 3 and max(last) - min(last) <= 0.03 * statistics.median(last):
                break
        return windows


def describe(windows: list[Window], batch: int, new_tokens: int) -> str:
    """The ceiling's line: the median of the last three windows, their spread, and the passes that
    decoded alone apart from those that took prompts in."""
    rates = [w.tokens_per_second for w in windows[-3:]]
    rate = statistics.median(rates)
    alone = sum(w.decoding_seconds for w in windows) / max(1, sum(w.decoding_passes for w in windows))
    joined_passes = max(1, sum(w.joined_passes for w in windows))
    joined = sum(w.joined_seconds for w in windows) / joined_passes
    prompts = sum(w.prompt_tokens for w in windows) / joined_passes
    return (
        f"ceiling, {new_tokens} new tokens, {batch} sequences: {rate:,.0f} tokens/s (median of the last 3 of "
        f"{len(windows)} windows, spread {(max(rates) - min(rates)) / rate:.1%}); a pass decoding alone "
        f"{1000 * alone:.2f} ms, one taking prompts in {1000 * joined:.2f} ms ({prompts:.0f} prompt tokens "
        f"a pass on average)"
    )


# --- the long prompt ----------------------------------------------------------------------------------


def long_window_model(model: str, into: Path, window: int) -> str:
    """The served model's architecture with a `window`-token window, random weights, its tokenizer."""
    import torch

    from gptcore.export.model_files import model_files_at, write_model_files
    from gptcore.model.config import ModelConfig
    from gptcore.model.gpt import GPT

    files = model_files_at(Path(model))
    config = {**json.loads(files.config.read_text()), "block_size": window}
    torch.manual_seed(0)
    write_model_files(GPT(ModelConfig(**config)), files.tokenizer, into)
    return str(into)


async def stream_gaps(host: str, port: int, prompt: str, new_tokens: int, arrivals: list[float]) -> None:
    """One streaming completion; the time each of its chunks arrived is appended to `arrivals`."""
    fields = {
        "prompt": prompt,
        "max_tokens": new_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    payload = json.dumps(fields).encode()
    reader, writer = await asyncio.open_connection(host, port)
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    )
    writer.write(head.encode() + payload)
    async for line in reader:
        if line.startswith(b"data: {"):
            arrivals.append(time.perf_counter())
    writer.close()


async def long_prompt_case(url: str, prompt_tokens: int, tokenizer: object) -> tuple[float, float, float]:
    """32 streaming clients decode; a `prompt_tokens`-token prompt arrives among them. Their largest gap
    between two tokens after it arrived, and their median gap before it (seconds); when it arrived."""
    host, port = "127.0.0.1", int(url.rsplit(":", 1)[1])
    words = " ".join(f"x{i}" for i in range(prompt_tokens * 2))
    ids = tokenizer.encode(words).ids[:prompt_tokens]  # type: ignore[attr-defined]
    long_prompt = tokenizer.decode(ids)  # type: ignore[attr-defined]
    arrivals: list[list[float]] = [[] for _ in range(32)]
    streams = [
        asyncio.create_task(stream_gaps(host, port, PROMPTS[i % 8], 400, arrivals[i])) for i in range(32)
    ]
    await asyncio.sleep(1.5)  # every stream decoding
    arrived = time.perf_counter()
    await asyncio.gather(stream_gaps(host, port, long_prompt, 1, []))
    answered = time.perf_counter()
    await asyncio.gather(*streams)
    before = [b - a for times in arrivals for a, b in itertools.pairwise(times) if b < arrived]
    during = [
        b - a for times in arrivals for a, b in itertools.pairwise(times) if arrived <= b <= answered + 0.05
    ]
    return max(during), statistics.median(before), answered - arrived


# --- main ---------------------------------------------------------------------------------------------


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


def max_batch(server_args: list[str]) -> int:
    """The server's `--max-batch`: a row with more clients than this is a crowd (some of it queued)."""
    from gptcore.serving.config import ServeConfig

    if "--max-batch" in server_args:
        return int(server_args[server_args.index("--max-batch") + 1])
    return ServeConfig.model_fields["max_batch"].default


def machine() -> str:
    model = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")), platform.processor(),
    )  # fmt: skip
    return f"{os.cpu_count()} cores, {model}, {time.strftime('%Y-%m-%d')}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models:/gptpipe-iteration-1@champion")
    parser.add_argument("--clients", default="1,8,32,64,128,256")
    parser.add_argument("--new-tokens", default="20,200")
    parser.add_argument("--seconds", type=float, default=12.0, help="measured seconds a row, over its rounds")
    parser.add_argument(
        "--rounds", type=int, default=8, help="a row's stretches, each after a ceiling window"
    )
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds of load before each round counts")
    parser.add_argument("--client-processes", type=int, default=2)
    parser.add_argument("--ceiling-batch", type=int, default=32)
    parser.add_argument("--long-prompt", type=int, default=0, help="tokens of the long-prompt case (0: none)")
    parser.add_argument("--server-args", default="", help="more `gptpipe serve` options, space-separated")
    args = parser.parse_args()
    scratch = tempfile.TemporaryDirectory(prefix="gptpipe-serve-load-")
    model = local_model(args.model, Path(scratch.name))
    lengths = [int(n) for n in args.new_tokens.split(",")]
    print(f"machine: {machine()}; clients in {args.client_processes} processes", flush=True)
    alone = Ceiling(model, args.ceiling_batch)
    for new_tokens in lengths:
        print(describe(alone.steady(new_tokens), args.ceiling_batch, new_tokens), flush=True)
    rows: list[Row] = []
    batch = max_batch(args.server_args.split())
    with running_server(model, args.server_args.split()) as (url, server):
        for new_tokens in lengths:
            alone.window(new_tokens, 1.0)  # warm again after the server's start
            for clients in (int(c) for c in args.clients.split(",")):
                same = [r for r in rows if r.new_tokens == new_tokens]
                best = max(same, key=lambda r: statistics.median(r.of_ceiling), default=None)
                rate = max((r.tokens_per_second for r in same), default=0.0)
                cycle = clients * new_tokens / rate if rate else 0.0  # every client answered once
                best_cycle = best.clients * new_tokens / rate if best else 0.0
                rounds = []
                for _ in range(args.rounds):
                    ceiling = alone.window(new_tokens, args.seconds / args.rounds).tokens_per_second
                    reference = float("nan")
                    if clients > batch and best:  # a crowd: the best row's clients again, just before
                        reference = measure_round(
                            url, server, best.clients, new_tokens, ceiling, args, best_cycle
                        ).tokens_per_second
                    round_ = measure_round(url, server, clients, new_tokens, ceiling, args, cycle)
                    round_.reference = reference
                    rounds.append(round_)
                rows.append(Row(clients, new_tokens, rounds, best.clients if clients > batch and best else 0))
                done = {
                    "clients": clients,
                    "new_tokens": new_tokens,
                    "tokens/s": round(rows[-1].tokens_per_second),
                }
                print(json.dumps(done), file=sys.stderr, flush=True)
    print("| " + " | ".join(HEADERS) + " |")
    print("|" + "---|" * len(HEADERS))
    for row in rows:
        one = next(r for r in rows if r.new_tokens == row.new_tokens).tokens_per_second
        print("| " + " | ".join(row.cells(one)) + " |")
    for new_tokens in lengths:
        crowds = [r for r in rows if r.new_tokens == new_tokens and r.against]
        if crowds:
            against = ", ".join(
                f"{r.clients} against {r.against}: {statistics.median(r.of_best):.0%} "
                f"({r.of_best[0]:.0%}-{r.of_best[-1]:.0%})"
                for r in crowds
            )
            print(
                f"{new_tokens} new tokens, the crowds past --max-batch {batch} against the best row before "
                f"them, measured again just before each crowd round (median, rounds): {against}"
            )
    shared = [r for r in rows if any(round_.other_cpu > 0.05 for round_ in r.rounds)]
    if shared:
        print(f"shared: {len(shared)} rows ran beside other work (over 0.05 cores of other CPU): rerun")
    if args.long_prompt:
        long_prompt(model, Path(scratch.name), args)
    scratch.cleanup()


def long_prompt(model: str, scratch: Path, args: argparse.Namespace) -> None:
    """The long-prompt case, with the server's budget and without one (a budget past the prompt)."""
    from tokenizers import Tokenizer

    from gptcore.export.model_files import model_files_at

    long_model = long_window_model(model, scratch / "long", max(2048, args.long_prompt + 8))
    tokenizer = Tokenizer.from_file(str(model_files_at(Path(long_model)).tokenizer))
    for label, extra in (("budgeted", []), ("one piece", ["--step-tokens", str(args.long_prompt + 64)])):
        with running_server(long_model, [*args.server_args.split(), *extra]) as (url, _):
            worst, usual, took = asyncio.run(long_prompt_case(url, args.long_prompt, tokenizer))
        print(
            f"long prompt ({label}): {args.long_prompt} tokens arriving among 32 streaming clients, answered "
            f"in {took:.3f} s; their largest gap between tokens meanwhile {worst * 1000:.1f} ms, their "
            f"median gap before it {usual * 1000:.1f} ms"
        )


if __name__ == "__main__":
    main()
