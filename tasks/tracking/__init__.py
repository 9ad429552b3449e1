"""MLflow tracking, one package: where records go and what never goes there (`store`), the one
writer every call goes through (`writer`), a training run's callback on top of it (`callback`), a
checked session on one experiment (`session`), a flow run's parent and stage runs (`recorder`), and the
runs other flows and commands open and find (`parent_run`, `run_search`), and the UI's addresses and
`gptpipe ui`'s page in it (`ui`): flows reach MLflow only here.

Run ids are passed explicitly everywhere: nothing uses MLflow's thread-local active run.
"""

from tasks.tracking.callback import RUN_ID_KEY, MLflowCallback
from tasks.tracking.delivery.writer import DeliverySettings, RunWriter, WriterReport
from tasks.tracking.parent_run import ParentRun
from tasks.tracking.recorder import PipelineRecorder
from tasks.tracking.session import TrackingSession, open_training_run, training_metadata
from tasks.tracking.store import TrackingError, TrackingTarget, resolve_target

__all__ = [
    "RUN_ID_KEY",
    "DeliverySettings",
    "MLflowCallback",
    "ParentRun",
    "PipelineRecorder",
    "RunWriter",
    "TrackingError",
    "TrackingSession",
    "TrackingTarget",
    "WriterReport",
    "open_training_run",
    "resolve_target",
    "training_metadata",
]
