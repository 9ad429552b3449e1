"""The Prefect flows (`pipeline`, `compare`, `sweep` with `trials` and `sweep_pool`, `finetune`; the run's
report and failure hooks), the `gptpipe` command line (`cli/`), what every command's process sets up
(`environment/`), and a team's server stack (`servers/`)."""
