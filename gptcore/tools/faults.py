"""Kill points: named moments at which a fault test makes this process die, so a kill is placed, not timed.

`GPTPIPE_FAULT_KILL=<point>:<step>` makes the process SIGKILL itself the first time it reaches
`kill_point("<point>", <step>)`; `<point>:<step>:<rank>` only in the process of that rank (torchrun's
`RANK`), the others running on. No handler runs and nothing buffered is flushed: the same as `kill -9`
at that moment. Unset (every real run), a point costs one comparison.

The points, each at a training step:
- `step`: after that step, its log line and whatever was due at it (an evaluation, a checkpoint handed
  to the writer);
- `checkpoint-record`: the record of that step's checkpoint complete under its temporary name, not yet
  renamed (the weights, complete, wait for their rename under theirs);
- `checkpoint-weights`: the weights complete under their temporary name and their record in place, not
  yet renamed (the one moment the old and the new checkpoint both have a record);
- `checkpoint-manifest`: the folder's manifest listing that checkpoint, complete under its temporary
  name, not yet renamed.
"""

from __future__ import annotations

import functools
import os
import signal

KILL_ENV = "GPTPIPE_FAULT_KILL"


@functools.cache
def _armed() -> tuple[str, int] | None:
    """(point, step) this process dies at, from the environment when first asked (a process forked from
    one that imported this module has its own); None when it runs on."""
    spec = os.environ.get(KILL_ENV)
    if not spec:
        return None
    point, step, *rank = spec.split(":")
    if rank and rank[0] != os.environ.get("RANK", "0"):
        return None
    return point, int(step)


def kill_point(point: str, step: int) -> None:
    """Die here when `GPTPIPE_FAULT_KILL` names this point at this step."""
    armed = _armed()
    if armed is not None and (point, step) == armed:
        os.kill(os.getpid(), signal.SIGKILL)
