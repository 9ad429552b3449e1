"""`gptpipe serve`, for real: a small model trained on real text, served on loopback by uvicorn, spoken to
by OpenAI's own client and by plain HTTP. Batched decoding gives each request what it would get alone;
limits, deadlines and clients that leave free the batch's rows; every refusal is one sentence."""

from __future__ import annotations

import json
import socket
import sysconfig
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import torch
from waiting import until

from gptcore.data.config import CorpusConfig, TokenizerConfig
from gptcore.data.corpus import open_corpus
from gptcore.data.tokenizer import train_tokenizer
from gptcore.export.model_files import model_files_at, write_model_files
from gptcore.generate import Completer, sample
from gptcore.model.config import ModelConfig
from gptcore.model.gpt import GPT
from gptcore.serving.app import CompletionServer, create_app
from gptcore.serving.config import ServeConfig
from gptcore.serving.decoder import BatchDecoder, StepReport
from gptcore.serving.scheduler import QueueFull, Scheduler
from gptcore.serving.sequence import Sampling, Sequence
from gptcore.serving.served import load_served

STDLIB = Path(sysconfig.get_paths()["stdlib"])
CONFIG = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=400)
PROMPTS = [f"def function_{i}(value):\n    return " for i in range(32)]


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Model files as the pipeline logs them: a tokenizer trained on the json package's sources and a
    small model (random weights, seeded: serving is about what is decoded, not how well)."""
    folder = tmp_path_factory.mktemp("served")
    corpus = open_corpus(CorpusConfig(source="local", paths=[str(STDLIB / "json" / "*.py")]))
    tokenizer = train_tokenizer(corpus, TokenizerConfig(vocab_size=400), folder)
    torch.manual_seed(0)
    write_model_files(GPT(CONFIG), Path(tokenizer.path), folder / "model")
    return folder / "model"


@dataclass
class Running:
    url: str
    server: CompletionServer

    def running(self) -> int:
        return httpx.get(f"{self.url}/health").json()["running"]

    def wait_until_idle(self) -> None:
        until(lambda: self.running() == 0, "the batch is empty again")

    def generated(self) -> float:
        """Tokens generated so far: a row freed early has generated far fewer than it asked for."""
        return float(figures(httpx.get(f"{self.url}/metrics").text)["gptpipe_generated_tokens_total"])


@contextmanager
def serving(folder: Path, **limits: object) -> Iterator[Running]:
    """The server of `gptpipe serve` on a free loopback port, in this process."""
    import uvicorn

    server = CompletionServer(
        lambda: load_served(model_files_at(folder), "tiny"), ServeConfig(**limits)
    ).start()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.bind(("127.0.0.1", 0))
    web = uvicorn.Server(uvicorn.Config(create_app(server), log_level="warning"))
    thread = threading.Thread(target=web.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    until(lambda: web.started or not thread.is_alive(), "uvicorn serves", every=0.01)
    assert web.started, "uvicorn stopped before serving (its log says why)"
    try:
        yield Running(f"http://127.0.0.1:{listener.getsockname()[1]}", server)
    finally:
        web.should_exit = True
        thread.join(timeout=30)
        server.stop()


class HeldSteps:
    """A running server's decode steps, run only when the test lets them (the decoder's `step`, wrapped):
    what a row had generated when its client left or its deadline passed is then known, not raced, and
    freed at the next step means one step's token more, exactly."""

    def __init__(self, server: CompletionServer) -> None:
        decoder = server.scheduler.decoder
        assert decoder is not None, "start the server first"
        self._decoder, self._step = decoder, decoder.step
        self._turn = threading.Condition()
        self._asked = 0  # steps the loop has come to
        self._allowed: int | None = None  # steps it may run; None: every one

    def __enter__(self) -> HeldSteps:
        self._decoder.step = self._gated  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()  # the server stops after this: a held loop would never end
        del self._decoder.step

    def _gated(self) -> StepReport:
        with self._turn:
            self._asked += 1
            self._turn.notify_all()
            self._turn.wait_for(lambda: self._allowed is None or self._asked <= self._allowed)
        return self._step()

    def hold(self) -> None:
        """From now the loop stops at its next step (one under way completes)."""
        with self._turn:
            self._allowed = self._asked

    def waiting(self) -> None:
        """Return once the held loop waits at a step: every token of the steps before it is generated
        and counted."""
        with self._turn:
            assert self._allowed is not None, "hold the loop first"
            came = self._turn.wait_for(lambda: self._asked > self._allowed, timeout=120)  # only ends a hang
        assert came, "the decode loop never came to its next step"

    def release(self) -> None:
        with self._turn:
            self._allowed = None
            self._turn.notify_all()


def complete(url: str, headers: dict | None = None, **body: object) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=60)


# --- batched decoding -----------------------------------------------------------------------------


def test_a_greedy_completion_is_the_same_alone_as_in_a_batch_of_32(model_folder: Path) -> None:
    """Sequences joining a running batch at different steps, windows refilled past the model's 32
    positions: each decodes token for token what `sample` decodes for it alone."""
    served = load_served(model_files_at(model_folder), "tiny")
    prompts = [served.encode(prompt)[: 1 + i] for i, prompt in enumerate(PROMPTS)]  # 1 to 32 tokens
    alone = [sample(served.model, ids, 40, temperature=0) for ids in prompts]
    decoder = BatchDecoder(served.model, 32)
    sequences = [Sequence(ids, Sampling(max_tokens=40, temperature=0), served.tokenizer) for ids in prompts]
    waiting = list(sequences)
    while waiting or decoder.sequences:
        joining = min(3, decoder.free, len(waiting))  # a few join at each step
        decoder.admit([waiting.pop(0) for _ in range(joining)])
        decoder.step()
    assert [sequence.generated for sequence in sequences] == alone


def test_a_seeded_sample_is_the_same_whatever_is_decoded_beside_it(model_folder: Path) -> None:
    served = load_served(model_files_at(model_folder), "tiny")
    ids = served.encode(PROMPTS[0])
    seeded = Sampling(max_tokens=30, temperature=1.0, top_k=40, top_p=0.9, seed=7)

    def decode(beside: int) -> list[int]:
        decoder = BatchDecoder(served.model, 8)
        others = [Sequence(served.encode(p), Sampling(max_tokens=30, temperature=1.0), served.tokenizer)
                  for p in PROMPTS[1 : 1 + beside]]  # fmt: skip
        mine = Sequence(ids, seeded, served.tokenizer)
        decoder.admit([*others, mine])
        while decoder.sequences:
            decoder.step()
        return mine.generated

    assert decode(0) == decode(7)


def test_a_sequence_that_cannot_be_sampled_ends_alone_and_a_vanishing_temperature_is_greedy(
    model_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One row's sampling failing (its probabilities not numbers) ends that sequence with `error`; the
    others of the same steps decode what they decode without it. A temperature of 1e-40, whose division
    once overflowed the logits to inf and failed every sequence of the step, is greedy."""
    from gptcore.serving import decoder as decoder_module

    served = load_served(model_files_at(model_folder), "tiny")
    prompts = [served.encode(prompt) for prompt in PROMPTS[:4]]
    healthy = [Sampling(max_tokens=12, temperature=0), Sampling(max_tokens=12, temperature=1.0, seed=3),
               Sampling(max_tokens=12, temperature=1e-40)]  # fmt: skip
    poisoned = Sampling(max_tokens=12, temperature=1.5, seed=5)
    real_choose_next = decoder_module.choose_next

    def choose_next(logits: torch.Tensor, temperature: float, *args: object) -> torch.Tensor:
        poison = torch.full_like(logits, float("nan")) if temperature == poisoned.temperature else logits
        return real_choose_next(poison, temperature, *args)

    monkeypatch.setattr(decoder_module, "choose_next", choose_next)

    def decode(samplings: list[Sampling]) -> list[Sequence]:
        decoder = BatchDecoder(served.model, 8)
        sequences = [
            Sequence(ids, how, served.tokenizer) for ids, how in zip(prompts, samplings, strict=False)
        ]
        decoder.admit(sequences)
        while decoder.sequences:
            decoder.step()
        return sequences

    alone = decode(healthy)
    beside = decode([*healthy, poisoned])
    assert beside[-1].finish_reason == "error" and beside[-1].generated == []
    assert [s.generated for s in beside[:-1]] == [s.generated for s in alone]
    assert all(s.finish_reason == "length" for s in beside[:-1])
    assert alone[2].generated == sample(served.model, prompts[2], 12, temperature=0)  # 1e-40: greedy
    with serving(model_folder) as running:  # and at the door: a completion, not a failure
        answer = complete(running.url, prompt=PROMPTS[0], max_tokens=4, temperature=1e-40)
        greedy = complete(running.url, prompt=PROMPTS[0], max_tokens=4, temperature=0)
        assert (
            answer.status_code == 200
            and answer.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]
        )


def test_a_long_prompt_goes_in_by_chunks_while_the_batch_decodes_each_step(model_folder: Path) -> None:
    """A step runs at most its token budget: the decoding sequences' next tokens, then as much of a long
    prompt as is left. They take a token at every step while it goes in, and everyone still decodes
    what `sample` decodes alone (the long one past its window, refilled)."""
    served = load_served(model_files_at(model_folder), "tiny")
    greedy = Sampling(max_tokens=20, temperature=0)
    short = [served.encode(prompt)[:3] for prompt in PROMPTS[:3]]
    long_ids = served.encode("".join(PROMPTS))[:30]
    decoder = BatchDecoder(served.model, 4, step_tokens=12)
    decoding = [Sequence(ids, greedy, served.tokenizer) for ids in short]
    decoder.admit(decoding)
    assert decoder.step().first_tokens == 3  # the three short prompts, in one prefill
    long = Sequence(long_ids, Sampling(max_tokens=6, temperature=0), served.tokenizer)
    decoder.admit([long])
    reports = []
    while not long.generated:
        reports.append(decoder.step())
    assert [(r.decoded, r.prefill_tokens, r.first_tokens) for r in reports] == [
        (3, 9, 0), (3, 9, 0), (3, 9, 0), (3, 3, 1)  # 12 tokens a step at most: 3 decoded, 9 of the prompt
    ]  # fmt: skip
    while decoder.sequences:
        decoder.step()
    assert long.generated == sample(served.model, long_ids, 6, temperature=0)
    assert [s.generated for s in decoding] == [sample(served.model, ids, 20, temperature=0) for ids in short]


def test_every_row_in_use_a_long_prompt_done_swaps_rows_with_a_prompt_still_waiting(
    model_folder: Path,
) -> None:
    """Three rows, all held: a row freed by a one-token answer goes to a newcomer while a long prompt is
    still going in; when that one is in, it takes the first row past the decoding ones by swapping with
    the newcomer. Everyone decodes what `sample` decodes alone."""
    served = load_served(model_files_at(model_folder), "tiny")
    ids = served.encode("".join(PROMPTS))

    def sequence(start: int, size: int, new: int) -> Sequence:
        return Sequence(ids[start : start + size], Sampling(max_tokens=new, temperature=0), served.tokenizer)

    short, long, waiting = sequence(0, 3, 1), sequence(3, 20, 5), sequence(23, 2, 5)
    decoder = BatchDecoder(served.model, 3, step_tokens=8)
    decoder.admit([short, long, waiting])
    decoder.step()
    assert short.finish_reason == "length" and decoder.free == 1
    newcomer = sequence(25, 3, 5)
    decoder.admit([newcomer])
    while decoder.sequences:
        decoder.step()
    for done in (long, waiting, newcomer):
        assert done.generated == sample(served.model, done.prompt_ids, 5, temperature=0)


def test_a_crowd_waits_in_order_and_none_is_refused_below_the_queue_limit(model_folder: Path) -> None:
    """Two rows, eight places in the queue: ten sequences are taken, the eleventh refused; they start
    in the order they came, two at a time."""
    served = load_served(model_files_at(model_folder), "tiny")
    scheduler = Scheduler(lambda: BatchDecoder(served.model, 2, step_tokens=16), max_queue=8).start()
    greedy = Sampling(max_tokens=4, temperature=0)
    crowd = [Sequence(served.encode(PROMPTS[i]), greedy, served.tokenizer) for i in range(11)]
    try:
        with scheduler.held():
            for sequence in crowd[:10]:
                scheduler.submit([sequence])
            with pytest.raises(QueueFull, match="at most 8"):
                scheduler.submit([crowd[10]])
        until(lambda: all(s.finished for s in crowd[:10]), "the ten are answered")
    finally:
        scheduler.stop()
    started = [s.first_token_at for s in crowd[:10]]
    assert started == sorted(started) and all(s.finish_reason == "length" for s in crowd[:10])
    # two rows: each starts once the one two places before it has ended
    assert all(crowd[i].first_token_at >= crowd[i - 2].finished_at for i in range(2, 10))


# --- the API ------------------------------------------------------------------------------------------


def test_an_openai_client_gets_completions_models_and_streams(model_folder: Path) -> None:
    from openai import OpenAI

    with serving(model_folder, max_tokens_cap=64) as running:
        client = OpenAI(base_url=f"{running.url}/v1", api_key="unused")
        [card] = client.models.list().data
        assert card.id == "tiny" and card.model_dump()["max_tokens"] == 64
        answer = client.completions.create(model="tiny", prompt=PROMPTS[:3], max_tokens=12, temperature=0)
        assert [choice.index for choice in answer.choices] == [0, 1, 2]
        assert all(choice.finish_reason == "length" for choice in answer.choices)
        assert answer.usage.completion_tokens == 36 and answer.usage.prompt_tokens > 3
        completer = Completer.from_paths(
            load_served(model_files_at(model_folder), "x").model, model_folder / "tokenizer.json"
        )
        assert answer.choices[0].text == completer.complete([PROMPTS[0]], 12, temperature=0)[0]

        pieces, reasons = [], []
        stream = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=12, temperature=0,
                                           stream=True, stream_options={"include_usage": True})  # fmt: skip
        for chunk in stream:
            pieces += [choice.text for choice in chunk.choices]
            reasons += [choice.finish_reason for choice in chunk.choices if choice.finish_reason]
            usage = chunk.usage or None
        assert "".join(pieces) == answer.choices[0].text and reasons == ["length"]
        assert usage is not None and usage.completion_tokens == 12


def test_a_stop_string_ends_the_text_before_it(model_folder: Path) -> None:
    with serving(model_folder) as running:
        full = complete(running.url, prompt=PROMPTS[0], max_tokens=20, temperature=0).json()["choices"][0][
            "text"
        ]
        stop = full[5:8]
        cut = complete(running.url, prompt=PROMPTS[0], max_tokens=20, temperature=0, stop=[stop]).json()
        assert cut["choices"][0] == {"text": full[: full.index(stop)], "index": 0, "logprobs": None,
                                     "finish_reason": "stop"}  # fmt: skip
        body = {"prompt": PROMPTS[0], "max_tokens": 20, "temperature": 0, "stop": stop, "stream": True}
        streamed = httpx.post(f"{running.url}/v1/completions", json=body, timeout=60)
        events = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
        assert "".join(e["choices"][0]["text"] for e in events) == full[: full.index(stop)]  # nothing past it


def test_mlflow_clients_keep_their_body_and_their_answer(model_folder: Path) -> None:
    """The body MLflow's scoring server took, answered as the logged model answers it (same defaults)."""
    completer = Completer.from_paths(
        load_served(model_files_at(model_folder), "x").model, model_folder / "tokenizer.json"
    )
    with serving(model_folder) as running:
        answer = httpx.post(
            f"{running.url}/invocations", json={"inputs": PROMPTS[:2], "params": {"max_new_tokens": 8}}
        )
        split = {"dataframe_split": {"columns": ["prompt"], "data": [[PROMPTS[0]], [PROMPTS[1]]]},
                 "params": {"max_new_tokens": 8}}  # fmt: skip
        assert httpx.post(f"{running.url}/invocations", json=split).json() == answer.json()
        wrong = httpx.post(f"{running.url}/invocations", json={"inputs": ["x"], "params": {"top_k": -1}})
        assert httpx.get(f"{running.url}/ping").status_code == 200
    assert answer.json() == {
        "predictions": completer.complete(PROMPTS[:2], 8, temperature=0.8, top_k=50, seed=0)
    }
    assert wrong.status_code == 400 and wrong.json() == {
        "error_code": "INVALID_PARAMETER_VALUE",
        "message": "params.top_k: -1 is not allowed (input should be greater than or equal to 0)",
    }


def test_concurrent_requests_share_decode_steps_and_get_what_they_get_alone(model_folder: Path) -> None:
    """16 requests held in the queue until all wait, then let in at one step boundary: they decode
    together, step by step, and each gets what it got alone."""
    with serving(model_folder) as running:
        alone = [complete(running.url, prompt=p, max_tokens=16, temperature=0).json() for p in PROMPTS[:16]]
        before, prefills = decode_steps(running), prefill_figures(running)
        scheduler = running.server.scheduler
        with ThreadPoolExecutor(16) as pool:
            with scheduler.held():
                greedy = [
                    pool.submit(complete, running.url, prompt=p, max_tokens=16, temperature=0)
                    for p in PROMPTS[:16]
                ]
                until(lambda: scheduler.waiting == 16, "the 16 requests wait together")
            together = [answer.result().json() for answer in greedy]
        steps, batched = (
            after - earlier for after, earlier in zip(decode_steps(running), before, strict=True)
        )
        metrics = httpx.get(f"{running.url}/metrics").text
        prompt_tokens = sum(len(running.server.model.encode(p)) for p in PROMPTS[:16])
        assert (prefill_figures(running) - prefills).tolist() == [prompt_tokens, 0], (
            "packed, no pass of their own"
        )
    assert [a["choices"] for a in together] == [a["choices"] for a in alone]
    # a prompt's prefill gives its first token; each of the 15 steps after decodes all 16 together
    assert (steps, batched) == (15, 15 * 16)
    assert float(figures(metrics)["gptpipe_generated_tokens_total"]) == 32 * 16
    assert 'gptpipe_requests_total{endpoint="/v1/completions",status="200"} 32.0' in metrics


def figures(metrics: str) -> dict[str, str]:
    return dict(line.rsplit(" ", 1) for line in metrics.splitlines() if not line.startswith("#"))


def prefill_figures(running: Running) -> torch.Tensor:
    """Prompt tokens run so far, and the passes of their own prompts needed (a long one's chunks)."""
    counted = figures(httpx.get(f"{running.url}/metrics").text)
    names = ("gptpipe_prefilled_tokens_total", "gptpipe_prefill_seconds_count")
    return torch.tensor([float(counted[name]) for name in names])


def decode_steps(running: Running) -> tuple[float, float]:
    """Decode steps so far, and the sequences they decoded (the sum of their batch sizes)."""
    counted = figures(httpx.get(f"{running.url}/metrics").text)
    return tuple(float(counted[f"gptpipe_decode_step_batch_size_{k}"]) for k in ("count", "sum"))


# --- limits -----------------------------------------------------------------------------------------


def the_row(running: Running) -> Sequence:
    """The one sequence the server decodes now."""
    decoder = running.server.scheduler.decoder
    assert decoder is not None
    [row] = decoder.sequences
    return row


def test_a_full_queue_answers_429_with_retry_after(model_folder: Path) -> None:
    with (
        serving(model_folder, max_batch=1, max_queue=0, max_tokens_cap=100_000) as running,
        HeldSteps(running.server) as steps,
    ):
        body = {"prompt": "x", "max_tokens": 100_000, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", f"{running.url}/v1/completions", json=body, timeout=60) as busy:
            lines = busy.iter_lines()  # kept: a dropped iterator closes the connection
            next(lines)  # it decodes in the one row
            refused = complete(running.url, prompt="y", max_tokens=2)
            steps.hold()
            steps.waiting()
            made, row = running.generated(), the_row(running)
        until(lambda: row.cancelled, "the stream's client left: the server cancels its row")
        steps.release()
        running.wait_until_idle()
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
        assert "the server is busy" in refused.json()["error"]["message"]
        assert running.generated() == made + 1, "the row was freed at the step after its client left"
        assert row.finish_reason == "cancelled"
        assert complete(running.url, prompt="y", max_tokens=2).status_code == 200


def test_a_deadline_stops_the_request_and_frees_its_row(model_folder: Path) -> None:
    # The loop is held from before the request until its deadline has passed, so where it stops is the
    # test's to say: admitted (well within the 2 s), it waits at its first step while its time runs out.
    with (
        serving(model_folder, request_timeout=2, max_tokens_cap=100_000) as running,
        HeldSteps(running.server) as steps,
        ThreadPoolExecutor(1) as client,
    ):
        steps.hold()
        asked = client.submit(complete, running.url, prompt="x", max_tokens=100_000, ignore_eos=True)
        steps.waiting()
        row = the_row(running)
        late = asked.result(timeout=120)
        assert (
            late.status_code == 504
            and "longer than this server allows (2 s)" in late.json()["error"]["message"]
        )
        steps.release()
        running.wait_until_idle()
        assert running.generated() == 1, "ended at the step after its deadline, not at its length"
        assert row.finish_reason == "cancelled" and len(row.generated) == 1


def test_a_client_that_leaves_frees_its_row_at_the_next_step(model_folder: Path) -> None:
    with serving(model_folder, max_tokens_cap=100_000) as running, HeldSteps(running.server) as steps:
        port = int(running.url.rsplit(":", 1)[1])
        for stream in (True, False):
            body = json.dumps({"prompt": "x", "max_tokens": 100_000, "stream": stream, "ignore_eos": True})
            request = (
                f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n{body}"
            )
            with socket.create_connection(("127.0.0.1", port)) as client:
                client.sendall(request.encode())
                until(lambda: running.running() == 1, "it decodes")
                steps.hold()
                steps.waiting()
                made, row = running.generated(), the_row(running)
            until(lambda row=row: row.cancelled, f"its client left: the server cancels its row ({stream=})")
            steps.release()
            running.wait_until_idle()
            assert running.generated() == made + 1, f"freed at the step after its client left ({stream=})"


def test_a_step_budget_without_room_for_prompts_is_one_line(
    model_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from flows.cli.main import main

    assert main(["serve", "--model", str(model_folder), "--max-batch", "64", "--step-tokens", "64"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert errors == [
        "error: --step-tokens 64: must exceed --max-batch 64 (a step decodes the whole batch and runs prompt "
        "tokens with the rest)"
    ]


def test_a_key_guards_everything_but_health(model_folder: Path) -> None:
    with serving(model_folder, api_key="s3cret") as running:
        url = running.url
        missing = complete(url, prompt="x", max_tokens=2)
        wrong = complete(url, {"Authorization": "Bearer nope"}, prompt="x", max_tokens=2)
        right = complete(url, {"Authorization": "Bearer s3cret"}, prompt="x", max_tokens=2)
        metrics = httpx.get(f"{url}/metrics")
        health = httpx.get(f"{url}/health")
    assert (missing.status_code, wrong.status_code, right.status_code) == (401, 401, 200)
    assert missing.json()["error"]["message"] == "a valid API key is required: Authorization: Bearer <key>"
    assert metrics.status_code == 401 and health.status_code == 200


def test_a_quantized_model_is_served_in_its_own_precision(model_folder: Path, tmp_path: Path) -> None:
    pytest.importorskip("torchao", reason="the quant extra is not installed")
    from gptcore.model.quantization import quantized

    fp32 = load_served(model_files_at(model_folder), "tiny")
    int8 = quantized(fp32.model, "int8-weight-only")
    write_model_files(int8, model_folder / "tokenizer.json", tmp_path / "int8", "int8-weight-only")
    with serving(tmp_path / "int8") as running:
        [card] = httpx.get(f"{running.url}/v1/models").json()["data"]
        answer = complete(running.url, prompt=PROMPTS[0], max_tokens=8, temperature=0)
    assert card["precision"] == "int8-weight-only" and (tmp_path / "int8" / "model.pt").is_file()
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 8
