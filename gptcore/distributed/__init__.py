"""Several processes: the process group a run joins, and torchrun launching it."""
