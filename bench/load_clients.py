"""The clients of `bench/serve_load.py`, in processes of their own: each process keeps its share of the
connections busy, one request at a time each, and reports what it measured and the CPU it spent.

A client is a keep-alive HTTP/1.1 connection written by hand over asyncio's streams (a request line, three
headers, the JSON body; the answer read by its Content-Length): a few tens of microseconds of CPU a
request, where httpx spends several hundred, so that on a machine whose cores the server shares, a row
measures the server rather than its clients. Every process starts sending at the same moment (a time
given by the parent), counts the requests that overlap the measured window, and sends no new request
after it; what it spent is its own CPU time over the whole run, reported beside the row.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

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


@dataclass(frozen=True)
class Load:
    """What one client process does: `connections` clients from `start` (time.time()) until `stop`."""

    host: str
    port: int
    connections: int
    first_client: int  # the index of its first client, so prompts differ across processes
    new_tokens: int
    start: float  # wall-clock time the clients start sending (every process the same)
    measure_from: float  # the measured window: requests are counted for their time inside it
    stop: float  # no request is sent after it; those in flight are answered and counted


@dataclass
class Measured:
    """What one client process saw: every request overlapping the window, and its own CPU seconds."""

    latencies: list[float] = field(default_factory=list)  # of requests that ended inside the window
    requests_in_window: float = 0.0  # each request's share of its time inside the window
    refused: int = 0  # 429 answers (the queue was full)
    failed: list[str] = field(default_factory=list)  # any other status, once each
    cpu_seconds: float = 0.0  # this process's CPU time from the start to the last answer


def body(prompt: str, new_tokens: int) -> bytes:
    fields = {"prompt": prompt, "max_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
    return json.dumps(fields).encode()


def request(host: str, payload: bytes) -> bytes:
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


async def answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One response's status and body (the server always sends a Content-Length)."""
    status = int((await reader.readline()).split(b" ", 2)[1])
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            length = int(value)
    return status, await reader.readexactly(length)


async def client(load: Load, index: int, measured: Measured) -> None:
    reader, writer = await asyncio.open_connection(load.host, load.port)
    await asyncio.sleep(max(0.0, load.start - time.time()))
    sent = 0
    try:
        while (started := time.time()) < load.stop:
            prompt = PROMPTS[(index + sent) % len(PROMPTS)]
            writer.write(request(load.host, body(prompt, load.new_tokens)))
            status, content = await answer(reader)
            ended = time.time()
            sent += 1
            if status == 429:
                measured.refused += 1
                continue
            if status != 200:
                measured.failed.append(f"{status} {content[:200].decode(errors='replace')}")
                continue
            inside = max(0.0, min(ended, load.stop) - max(started, load.measure_from))
            share = inside / max(ended - started, 1e-9)
            measured.requests_in_window += share
            if load.measure_from <= ended <= load.stop:
                measured.latencies.append(ended - started)
    finally:
        writer.close()


async def run(load: Load) -> Measured:
    measured = Measured()
    cpu = time.process_time()
    clients = range(load.first_client, load.first_client + load.connections)
    await asyncio.gather(*(client(load, index, measured) for index in clients))
    measured.cpu_seconds = time.process_time() - cpu
    return measured


def serve_clients(load: Load, results: Connection) -> None:
    """A client process's body (multiprocessing's target): run the load, send back what it measured."""
    results.send(asyncio.run(run(load)))
    results.close()
