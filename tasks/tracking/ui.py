"""MLflow's UI as a model-training user expects it: the addresses gptpipe prints, and the one page
`gptpipe ui` adds to MLflow's own app.

MLflow 3.17's UI opens in its GenAI view (a run without a logged model, such as the pipeline's own, shown
as an "evaluation"; on loopback its Assistant panel open once per browser) unless the address asks for
model training after its `#` (`?workflowType=machine_learning`), and every link inside the UI drops that
ask. The view a browser keeps is in its localStorage (`mlflow.workflowType_v1`), which only a page of the
UI's own origin can set. `/gptpipe/training-view` is that page: it makes the browser keep the
model-training view and the Assistant closed (its button stays), then opens the UI route after its `#`.
`gptpipe ui` runs `mlflow server --app-name gptpipe-ui` (this package's `mlflow.app` entry point:
`create_app`). tests/test_mlflow_browser.py opens it in a fresh Chromium profile; tests/test_contracts.py
holds the two keys to the UI's build.
"""

from __future__ import annotations

from typing import Any

# MLflow 3.17's UI opens in its GenAI view unless the address (after the `#`) asks for model training.
MODEL_TRAINING_VIEW = "workflowType=machine_learning"
TRAINING_VIEW_PATH = "gptpipe/training-view"  # `gptpipe ui`'s page keeping that view (below)


def training_route(route: str) -> str:
    """The part after the UI's `#` that opens `route` (`/experiments/1/runs`) in the model-training view."""
    return f"#{route}?{MODEL_TRAINING_VIEW}"


def training_view_url(base: str, route: str = "") -> str:
    """`route` of the UI that `gptpipe ui` serves at `base` (`/experiments/1/runs`; empty: its home), opened
    through the training-view page so the browser keeps the model-training view."""
    return f"{base.rstrip('/')}/{TRAINING_VIEW_PATH}{training_route(route) if route else ''}"


# The UI's localStorage keys (MLflow 3.17's build) and what this page sets them to, as the UI stores
# values: JSON text.
KEPT = {
    "mlflow.workflowType_v1": '"machine_learning"',
    "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1": "true",
}

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>MLflow: model training</title></head>
<body><p>Opening MLflow in its model-training view…</p>
<script>
const kept = %s;
for (const [key, value] of Object.entries(kept)) localStorage.setItem(key, value);
location.replace("/" + location.hash);
</script></body></html>
"""


def training_view() -> Any:
    import json

    from flask import Response

    return Response(PAGE % json.dumps(KEPT), mimetype="text/html", headers={"Cache-Control": "no-store"})


def create_app() -> Any:
    """MLflow's ASGI app (FastAPI over its Flask app), with the training-view page on the Flask side."""
    from mlflow.server import app as flask_app
    from mlflow.server.fastapi_app import app

    flask_app.add_url_rule(f"/{TRAINING_VIEW_PATH}", "gptpipe_training_view", training_view)
    return app
