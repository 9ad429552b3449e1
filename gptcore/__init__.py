"""gptpipe's core: model, runtime, data and trainer in plain PyTorch, tokenizers and datasets.

Nothing here imports Prefect or MLflow; those adapters live in `tasks/` and `flows/`.
"""

__version__ = "0.1.0"
