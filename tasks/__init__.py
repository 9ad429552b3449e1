"""Prefect tasks: thin, cached wrappers around gptcore, each recorded in MLflow."""
