"""The bodies a completions server takes, checked into prompts and sampling settings.

`POST /v1/completions` takes OpenAI's completions body (`CompletionBody`), `POST /v1/chat/completions`
its chat completions body (`ChatBody`: the messages, in the chat template); `POST /invocations` takes
MLflow's scoring body (`{"inputs": [...], "params": {...}}`, or a one-column `dataframe_split`,
`dataframe_records`, `instances`), as the MLflow model of `tasks/tracking/models/gpt_pyfunc.py` does.
Anything else is a `BadRequest`: a status and one sentence naming the field, the value and what is
allowed; fields OpenAI defines that this server cannot honour (`n` above 1, `logprobs`, `echo`,
`response_format` other than text, `tools`, `logit_bias`, ...: `NOT_HONOURED`) are refused by name
rather than ignored. Fields OpenAI does not define pass, as its own server lets them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gptcore.chat.conversations import Conversation, parse_prompt
from gptcore.generate import DEFAULT_COMPLETION
from gptcore.serving.config import ServeConfig
from gptcore.serving.sequence import Sampling
from gptcore.tools.records import JSONObject

LARGEST_SEED = 2**63 - 1  # a torch.Generator's seed

# OpenAI's fields whose request this server cannot carry out, each with the values that ask for nothing
# beyond what it does (an answer as plain text, no tools): any other value is a 400 naming the field, since
# an answer that ignored it (not JSON, no tool call) would pretend to have done what was asked.
NOT_HONOURED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "response_format": (
        lambda v: v in (None, {"type": "text"}),
        '{"type": "text"}: the answer is plain text',
    ),
    "tools": (lambda v: v in (None, []), "none: this model calls no tools"),
    "tool_choice": (lambda v: v in (None, "none"), '"none": this model calls no tools'),
    "functions": (lambda v: v in (None, []), "none: this model calls no functions"),
    "function_call": (lambda v: v in (None, "none"), '"none": this model calls no functions'),
    "parallel_tool_calls": (lambda v: v in (None, False), "false: this model calls no tools"),
    "logit_bias": (lambda v: v in (None, {}), "none: tokens are not biased here"),
    "top_logprobs": (lambda v: v in (None, 0), "0: no log probabilities are returned"),
    "modalities": (lambda v: v in (None, ["text"]), '["text"]: the answer is text'),
    "audio": (lambda v: v is None, "none: the answer is text"),
    "prediction": (lambda v: v is None, "none: no predicted output is used"),
}


class BadRequest(Exception):
    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


class CompletionBody(BaseModel):
    """OpenAI's completions request; unknown fields pass, as OpenAI's own server lets them."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    prompt: Any  # a string or a list of them: checked by `_prompts`, which names what it takes
    max_tokens: int = Field(default=16, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)  # vLLM's extension: -1 or 0 for none
    seed: int | None = Field(default=None, ge=0, le=LARGEST_SEED)
    stop: Any = None  # a string or up to 4: checked by `completion_job`
    stream: bool = False
    stream_options: dict[str, bool] | None = None
    n: int = Field(default=1, ge=1, le=1)
    best_of: int | None = Field(default=None, ge=1, le=1)
    echo: bool = False
    logprobs: None = None
    suffix: None = None
    presence_penalty: float = Field(default=0.0, ge=0.0, le=0.0)
    frequency_penalty: float = Field(default=0.0, ge=0.0, le=0.0)
    user: str | None = None
    ignore_eos: bool = False  # vLLM's extension: go on past the end-of-text token (benchmarks use it)


class ChatBody(BaseModel):
    """OpenAI's chat completions request; unknown fields pass, as OpenAI's own server lets them."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: Any  # checked by `gptcore.chat.conversations.parse_prompt`, which says what it takes
    max_tokens: int | None = Field(default=None, ge=1)  # the older name of max_completion_tokens
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)  # vLLM's extension: -1 or 0 for none
    seed: int | None = Field(default=None, ge=0, le=LARGEST_SEED)
    stop: Any = None  # a string or up to 4
    stream: bool = False
    stream_options: dict[str, bool] | None = None
    n: int = Field(default=1, ge=1, le=1)
    logprobs: bool = Field(default=False, le=False)
    presence_penalty: float = Field(default=0.0, ge=0.0, le=0.0)
    frequency_penalty: float = Field(default=0.0, ge=0.0, le=0.0)
    user: str | None = None


class InvocationParams(BaseModel):
    """MLflow's `params` as the logged model's signature names them."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int = Field(default=DEFAULT_COMPLETION["max_new_tokens"], ge=1)
    temperature: float = Field(default=DEFAULT_COMPLETION["temperature"], ge=0.0, le=10.0)
    top_k: int | None = Field(default=DEFAULT_COMPLETION["top_k"], ge=0)
    seed: int = Field(default=DEFAULT_COMPLETION["seed"], ge=0, le=LARGEST_SEED)


@dataclass(frozen=True)
class Job:
    """A request's prompts (or a chat request's conversation) and how each is completed."""

    prompts: list[str]
    sampling: Sampling
    stream: bool = False
    include_usage: bool = False
    stop_at_end_of_text: bool = True  # MLflow's body always gets max_new_tokens, as its model gives them
    chat: Conversation | None = None  # a chat request's messages: its one prompt, in the template
    within_window: bool = False  # no length asked: the answer may fill what the prompt leaves of the window


def completion_job(body: bytes, limits: ServeConfig, served_name: str) -> Job:
    parsed = _validated(CompletionBody, body)
    _check_honoured(parsed)
    if parsed.echo:
        raise BadRequest(400, "echo: true is not supported: the prompt is not repeated (false only)", "echo")
    _check_model(parsed.model, served_name)
    _check_max_tokens(parsed.max_tokens, limits, "max_tokens")
    sampling = _sampling(parsed, parsed.max_tokens)
    usage = bool((parsed.stream_options or {}).get("include_usage"))
    prompts = _prompts(parsed.prompt, limits, "prompt")
    return Job(prompts, sampling, parsed.stream, usage, stop_at_end_of_text=not parsed.ignore_eos)


def chat_job(body: bytes, limits: ServeConfig, served_name: str) -> Job:
    """A chat completions request: its messages (ending on the user's) and how the answer is sampled;
    the answer is as long as the window allows unless `max_completion_tokens` (or `max_tokens`) says."""
    parsed = _validated(ChatBody, body)
    _check_honoured(parsed)
    _check_model(parsed.model, served_name)
    try:
        conversation = parse_prompt(parsed.messages)
    except ValueError as error:
        raise BadRequest(400, f"messages: {error}", "messages") from None
    field = "max_completion_tokens" if parsed.max_completion_tokens is not None else "max_tokens"
    wanted = parsed.max_completion_tokens or parsed.max_tokens or limits.max_tokens_cap
    _check_max_tokens(wanted, limits, field)
    usage = bool((parsed.stream_options or {}).get("include_usage"))
    asked = parsed.max_completion_tokens is not None or parsed.max_tokens is not None
    sampling = _sampling(parsed, wanted)
    return Job([], sampling, parsed.stream, usage, chat=conversation, within_window=not asked)


def _check_honoured(parsed: BaseModel) -> None:
    """A field of `NOT_HONOURED` that asks for something this server does not do: refused by name."""
    for field, value in (parsed.model_extra or {}).items():
        honoured, allowed = NOT_HONOURED.get(field, (None, ""))
        if honoured is not None and not honoured(value):
            shown = json.dumps(value)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise BadRequest(400, f"{field}: {shown} is not supported here (allowed: {allowed})", field)


def _check_model(named: str | None, served_name: str) -> None:
    if named not in (None, served_name):
        message = f"model: {named!r} is not served here; this server serves {served_name!r}"
        raise BadRequest(404, message, "model")


def _sampling(parsed: CompletionBody | ChatBody, max_tokens: int) -> Sampling:
    """The sampling settings both OpenAI bodies share, the stop strings checked."""
    stops = [parsed.stop] if isinstance(parsed.stop, str) else parsed.stop or []
    if not isinstance(stops, list) or len(stops) > 4 or not all(isinstance(s, str) and s for s in stops):
        raise BadRequest(400, f"stop: {stops!r} is not allowed: up to 4 strings, none empty", "stop")
    return Sampling(
        max_tokens=max_tokens,
        temperature=parsed.temperature,
        top_k=parsed.top_k if parsed.top_k and parsed.top_k > 0 else None,
        top_p=parsed.top_p,
        seed=parsed.seed,
        stop=tuple(stops),
    )


def invocation_job(body: bytes, limits: ServeConfig) -> Job:
    data = _json(body)
    if not isinstance(data, dict):
        raise BadRequest(400, "body: expected a JSON object with inputs (or dataframe_split) and params")
    params = _validated(InvocationParams, json.dumps(data.get("params") or {}).encode(), "params.")
    _check_max_tokens(params.max_new_tokens, limits, "params.max_new_tokens")
    sampling = Sampling(
        max_tokens=params.max_new_tokens,
        temperature=params.temperature,
        top_k=params.top_k or None,
        seed=params.seed,
    )
    return Job(_prompts(_invocation_prompts(data), limits, "inputs"), sampling, stop_at_end_of_text=False)


def _invocation_prompts(data: JSONObject) -> Any:
    """The prompts of any body MLflow's scoring server takes for a one-column model."""
    if "inputs" in data or "instances" in data:
        return data.get("inputs", data.get("instances"))
    if "dataframe_split" in data:
        split = data["dataframe_split"]
        rows = split.get("data") if isinstance(split, dict) else None
        return [row[0] if isinstance(row, list) and len(row) == 1 else row for row in rows or []] or None
    if "dataframe_records" in data and isinstance(data["dataframe_records"], list):
        return [next(iter(row.values()), None) if isinstance(row, dict) and len(row) == 1 else row
                for row in data["dataframe_records"]] or None  # fmt: skip
    raise BadRequest(400, "body: expected one of inputs, instances, dataframe_split or dataframe_records")


def _prompts(value: Any, limits: ServeConfig, field: str) -> list[str]:
    prompts = [value] if isinstance(value, str) else value
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
        message = f"{field}: expected a string or a list of 1 to {limits.max_prompts} strings"
        raise BadRequest(400, message, field)
    if len(prompts) > limits.max_prompts:
        message = f"{field}: {len(prompts)} prompts is more than one request may hold ({limits.max_prompts})"
        raise BadRequest(400, message, field)
    return prompts


def _check_max_tokens(value: int, limits: ServeConfig, field: str) -> None:
    if value > limits.max_tokens_cap:
        cap = limits.max_tokens_cap
        message = f"{field}: {value} is not allowed: from 1 to {cap} (this server's cap, GET /v1/models)"
        raise BadRequest(400, message, field)


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as error:
        raise BadRequest(400, f"body: not JSON ({error})") from None


def _validated(kind: type[BaseModel], body: bytes, prefix: str = "") -> Any:
    """The body as `kind`; its first problem as one sentence naming the field, the value and the rule."""
    try:
        return kind.model_validate_json(body, strict=True)
    except ValidationError as error:
        problem = error.errors(include_url=False)[0]
        if problem["type"] == "json_invalid":
            raise BadRequest(400, f"body: not JSON ({problem['msg']})") from None
        field = prefix + ".".join(str(part) for part in problem["loc"])
        field = field if field.isprintable() else json.dumps(field)  # a client's name: shown on one line
        if problem["type"] == "missing":
            raise BadRequest(400, f"{field}: required", field) from None
        if problem["type"] == "extra_forbidden":
            raise BadRequest(400, f"{field}: not a setting this endpoint takes", field) from None
        value = json.dumps(problem.get("input"))
        raise BadRequest(400, f"{field}: {value} is not allowed ({problem['msg'].lower()})", field) from None
