"""Bad requests to `gptpipe serve`: each answered with its status and one sentence naming the field, the
value and what is allowed (OpenAI's error object; MLflow's on /invocations), never a traceback, and the
server goes on answering."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.test_serving import Running, model_folder, serving

__all__ = ["model_folder"]  # the served model, a fixture of tests/test_serving.py

LIMITS = {"max_tokens_cap": 64, "max_body_bytes": 2048, "max_prompts": 4}
# (id, method, path, JSON body or raw bytes, status, a sentence the message holds)
CASES = [
    ("max-tokens-above-the-cap", "POST", "/v1/completions", {"prompt": "x", "max_tokens": 65}, 400,
     "max_tokens: 65 is not allowed: from 1 to 64 (this server's cap, GET /v1/models)"),
    ("max-tokens-zero", "POST", "/v1/completions", {"prompt": "x", "max_tokens": 0}, 400,
     "max_tokens: 0 is not allowed (input should be greater than or equal to 1)"),
    ("max-tokens-a-boolean", "POST", "/v1/completions", {"prompt": "x", "max_tokens": True}, 400,
     "max_tokens: true is not allowed (input should be a valid integer)"),
    ("prompt-beyond-the-window", "POST", "/v1/completions", {"prompt": "word " * 40}, 400,
     "tokens is more than this model's window of 32 tokens"),
    ("prompt-missing", "POST", "/v1/completions", {"max_tokens": 4}, 400, "prompt: required"),
    ("prompt-a-number", "POST", "/v1/completions", {"prompt": 5}, 400,
     "prompt: expected a string or a list of 1 to 4 strings"),
    ("too-many-prompts", "POST", "/v1/completions", {"prompt": ["a"] * 5}, 400,
     "prompt: 5 prompts is more than one request may hold (4)"),
    ("seed-too-large", "POST", "/v1/completions", {"prompt": "x", "seed": 2**70}, 400,
     "seed: 1180591620717411303424 is not allowed (input should be less than or equal to 92233720"),
    ("temperature-a-word", "POST", "/v1/completions", {"prompt": "x", "temperature": "hot"}, 400,
     'temperature: "hot" is not allowed (input should be a valid number)'),
    ("temperature-too-hot", "POST", "/v1/completions", {"prompt": "x", "temperature": 3}, 400,
     "temperature: 3 is not allowed (input should be less than or equal to 2)"),
    ("top-p-zero", "POST", "/v1/completions", {"prompt": "x", "top_p": 0}, 400,
     "top_p: 0 is not allowed (input should be greater than 0)"),
    ("an-empty-stop", "POST", "/v1/completions", {"prompt": "x", "stop": ["", "a"]}, 400,
     "stop: ['', 'a'] is not allowed: up to 4 strings, none empty"),
    ("several-choices", "POST", "/v1/completions", {"prompt": "x", "n": 3}, 400, "n: 3 is not allowed"),
    ("logprobs", "POST", "/v1/completions", {"prompt": "x", "logprobs": 2}, 400,
     "logprobs: 2 is not allowed (input should be null)"),
    ("echo", "POST", "/v1/completions", {"prompt": "x", "echo": True}, 400, "echo: true is not supported"),
    ("another-model", "POST", "/v1/completions", {"prompt": "x", "model": "gpt-4"}, 404,
     "model: 'gpt-4' is not served here; this server serves 'tiny'"),
    ("a-body-too-large", "POST", "/v1/completions", {"prompt": "x" * 3000}, 413,
     "body: more than 2048 bytes, this server's limit"),
    ("not-json", "POST", "/v1/completions", b"{oops", 400, "body: not JSON"),
    ("a-list-for-a-body", "POST", "/invocations", [1, 2], 400,
     "body: expected a JSON object with inputs (or dataframe_split) and params"),
    ("invocations-without-inputs", "POST", "/invocations", {"params": {}}, 400,
     "body: expected one of inputs, instances, dataframe_split or dataframe_records"),
    ("invocations-unknown-param", "POST", "/invocations", {"inputs": ["x"], "params": {"beams": 4}}, 400,
     "params.beams: not a setting this endpoint takes"),
    ("a-param-named-with-a-newline", "POST", "/invocations", {"inputs": ["x"], "params": {"\n": 1}}, 400,
     'params.\\n": not a setting this endpoint takes'),  # escaped: one line (found by the fuzz)
    ("invocations-above-the-cap", "POST", "/invocations", {"inputs": ["x"], "params": {"max_new_tokens": 65}},
     400, "params.max_new_tokens: 65 is not allowed: from 1 to 64"),
    ("no-such-endpoint", "GET", "/v2/anything", None, 404, "/v2/anything: no such endpoint"),
    ("wrong-method", "GET", "/v1/completions", None, 405, "GET /v1/completions: method not allowed"),
]  # fmt: skip


@pytest.fixture(scope="module")
def running(model_folder: Path) -> Iterator[Running]:
    with serving(model_folder, **LIMITS) as running:
        yield running


@pytest.mark.parametrize(("method", "path", "body", "status", "sentence"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_refused_in_one_sentence(
    running: Running, method: str, path: str, body: object, status: int, sentence: str
) -> None:
    content = body if isinstance(body, bytes) else None
    given = None if isinstance(body, bytes) or body is None else body
    response = httpx.request(method, f"{running.url}{path}", json=given, content=content, timeout=30)
    answer = response.json()
    message = answer["message"] if path == "/invocations" else answer["error"]["message"]
    assert response.status_code == status, answer
    assert sentence in message and "\n" not in message and "Traceback" not in response.text, message
    assert (
        httpx.post(f"{running.url}/v1/completions", json={"prompt": "x", "max_tokens": 1}).status_code == 200
    )
