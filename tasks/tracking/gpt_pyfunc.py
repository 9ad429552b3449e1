"""The MLflow model of a gptpipe checkpoint, written as "models from code": MLflow stores this file with
the model and runs it to load one (`mlflow.models.set_model` at the end), so nothing is pickled.

`predict` takes a list of prompts and returns their completions; params `max_new_tokens`, `temperature`,
`top_k` and `seed` (see the logged signature for their defaults). The artifacts are the weights
(`model.safetensors`), the model config and `tokenizer.json`; the `gptcore` package travels with the model
(`code_paths`), so it loads wherever MLflow and torch are installed. A bad prompt list or param value is an
`INVALID_PARAMETER_VALUE` error with one sentence, which MLflow's server answers with a 400.
"""

from __future__ import annotations

from typing import Any

import mlflow
from mlflow.pyfunc import PythonModel


class GptModel(PythonModel):
    def load_context(self, context: Any) -> None:
        from gptcore.generate import Completer
        from gptcore.model_files import read_model_files

        artifacts = context.artifacts
        model = read_model_files(artifacts["weights"], artifacts["config"])
        self.completer = Completer.from_paths(model, artifacts["tokenizer"])

    def predict(self, context: Any, model_input: list[str], params: dict | None = None) -> list[str]:
        from mlflow.exceptions import MlflowException
        from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

        from gptcore.errors import GptpipeError
        from gptcore.generate import DEFAULT_COMPLETION

        settings = {**DEFAULT_COMPLETION, **(params or {})}
        try:
            return self.completer.complete(model_input, **{k: settings[k] for k in DEFAULT_COMPLETION})
        except GptpipeError as error:
            raise MlflowException(str(error), error_code=INVALID_PARAMETER_VALUE) from None


mlflow.models.set_model(GptModel())
