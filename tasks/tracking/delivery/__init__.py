"""How records reach MLflow: the one writer thread, the operations it sends, and the outbox an outage spills
into.
"""
