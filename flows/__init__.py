"""Prefect flows and the `gptpipe` command line."""
