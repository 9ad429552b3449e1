"""The MLflow model of a gptpipe checkpoint, written as "models from code": MLflow stores this file with
the model and runs it to load one (`mlflow.models.set_model` at the end), so nothing is pickled.

`predict` takes a list of prompts and returns their completions; params `max_new_tokens`, `temperature`,
`top_k` and `seed` (see the logged signature for their defaults). The artifacts are the weights
(`model.safetensors`), the model config and `tokenizer.json`; the `gptcore` package travels with the model
(`code_paths`), so it loads wherever MLflow and torch are installed. A bad prompt list or param value is an
`INVALID_PARAMETER_VALUE` error with one sentence, which MLflow's server answers with a 400 (the server
would prefix "Failed to predict data '<the whole input>'" to its message: `BadRequest` keeps the sentence).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import mlflow
from mlflow.exceptions import MlflowException
from mlflow.pyfunc import PythonModel


class BadRequest(MlflowException):
    """A request this model refuses: its message stays the one sentence it was given."""

    def __init__(self, sentence: str) -> None:
        from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

        self._sentence = sentence
        super().__init__(sentence, error_code=INVALID_PARAMETER_VALUE)

    @property
    def message(self) -> str:
        return self._sentence

    @message.setter
    def message(self, _: str) -> None:
        pass  # the scoring server rewrites it to echo the whole request back; the sentence says enough


def _load(artifacts: dict[str, str]) -> Any:
    from gptcore.export.model_files import read_model_files
    from gptcore.generate import Completer

    quantization = artifacts.get("quantization")  # a quantized model's method; absent for fp32
    model = read_model_files(artifacts["weights"], artifacts["config"], quantization=quantization)
    return Completer.from_paths(model, artifacts["tokenizer"])


def _prompts(model_input: Any) -> Any:
    """The prompts as a list: from the one-column DataFrame the signature makes of them, a Series or an
    array; anything else as it came (the completer says what it expected)."""
    if getattr(model_input, "ndim", None) == 2 and hasattr(model_input, "iloc"):
        model_input = model_input.iloc[:, 0]
    return model_input.tolist() if hasattr(model_input, "tolist") else model_input


class GptModel(PythonModel):
    # The prompts are checked by the logged signature and the completer; MLflow's own type-hint checks
    # would want hints on `predict` (see there why it has none) and warn about every load without them.
    _skip_type_hint_validation = True

    def load_context(self, context: Any) -> None:
        # Every torch call of this model runs on one thread of its own. MLflow's server loads the model on
        # its main thread and predicts on a pool thread; two threads with OpenMP teams on few cores slow
        # each other down for good (2.5x per request on 2 cores, docs/benchmarks.md, Serving).
        self.torch_thread = ThreadPoolExecutor(1, thread_name_prefix="gptpipe-model")
        self.completer = self.torch_thread.submit(_load, context.artifacts).result()

    # No type hints on `model_input`: the logged signature says what it takes (MLflow then hands it over
    # as a one-column DataFrame), and hints would make MLflow load the model and predict while saving it,
    # on whichever thread saves it.
    def predict(self, context: Any, model_input, params: dict | None = None) -> list[str]:
        from gptcore.errors import GptpipeError
        from gptcore.generate import DEFAULT_COMPLETION

        settings = {**DEFAULT_COMPLETION, **(params or {})}
        chosen = {key: settings[key] for key in DEFAULT_COMPLETION}
        try:
            prompts = _prompts(model_input)
            return self.torch_thread.submit(self.completer.complete, prompts, **chosen).result()
        except GptpipeError as error:
            raise BadRequest(str(error)) from None


mlflow.models.set_model(GptModel())
