"""Round-trip latency of `gptpipe serve`: a logged model behind MLflow's model server on loopback.

Starts `gptpipe serve --model MODEL` on a free port, waits for it, sends `--requests` POSTs of one prompt
for `--new-tokens` greedy tokens, and prints the median and best round trip beside the same prediction
made in this process (the model loaded with `mlflow.pyfunc`), so the server's own overhead shows as the
difference. Run after `make run` (which registers `gptpipe-iteration-1@champion`):

    .venv/bin/python bench/serve_latency.py [--model models:/gptpipe-iteration-1@champion] [--new-tokens 40]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models:/gptpipe-iteration-1@champion")
    parser.add_argument("--new-tokens", type=int, default=40)
    parser.add_argument("--requests", type=int, default=10)
    args = parser.parse_args()
    port = free_port()
    command = [
        sys.executable,
        "-c",
        "import sys; from flows.cli.main import main; sys.exit(main(sys.argv[1:]))",
    ]
    server = subprocess.Popen(
        [*command, "serve", "--model", args.model, "--port", str(port)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    body = json.dumps(
        {"inputs": ["def main("], "params": {"max_new_tokens": args.new_tokens, "temperature": 0}}
    )
    try:
        started = time.perf_counter()
        while True:
            try:
                with urllib.request.urlopen(f"{url}/ping", timeout=2):
                    break
            except OSError:
                if server.poll() is not None or time.perf_counter() - started > 120:
                    raise SystemExit("the model server did not come up") from None
                time.sleep(0.25)
        ready = time.perf_counter() - started
        served = []
        for _ in range(args.requests + 1):  # the first warms the model up
            request = urllib.request.Request(
                f"{url}/invocations", body.encode(), {"Content-Type": "application/json"}
            )
            sent = time.perf_counter()
            with urllib.request.urlopen(request, timeout=120) as response:
                json.loads(response.read())
            served.append(time.perf_counter() - sent)
        served = served[1:]
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    from tasks.tracking.models.model_uri import load_model_uri

    model = load_model_uri(args.model)
    params = {"max_new_tokens": args.new_tokens, "temperature": 0}
    model.predict(["def main("], params=params)
    local = []
    for _ in range(args.requests):
        sent = time.perf_counter()
        model.predict(["def main("], params=params)
        local.append(time.perf_counter() - sent)
    figures = {
        "model": args.model,
        "new_tokens": args.new_tokens,
        "server_ready_seconds": round(ready, 2),
        "served_median_ms": round(1000 * statistics.median(served), 1),
        "served_best_ms": round(1000 * min(served), 1),
        "in_process_median_ms": round(1000 * statistics.median(local), 1),
        "server_overhead_ratio": round(statistics.median(served) / statistics.median(local), 3),
        "tokens_per_second_served": round(args.new_tokens / statistics.median(served), 1),
        "cpu_threads": os.cpu_count(),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
