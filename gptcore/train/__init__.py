"""Training: the job, the trainer and its parts (state, schedule, validation, guards, records, callbacks),
and a run on several processes.
"""
