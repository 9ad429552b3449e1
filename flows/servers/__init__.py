"""A team's server stack on one machine (`gptpipe servers`): PostgreSQL, MLflow's tracking server and
Prefect's server (`team`), started in order and stopped together with their process trees (`services`)."""
