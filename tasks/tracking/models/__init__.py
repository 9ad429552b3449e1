"""Checkpoints as MLflow models: logged models, their pyfunc loader, model URIs, the registry and quantized
versions.
"""
