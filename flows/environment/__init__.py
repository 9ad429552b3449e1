"""What every gptpipe command's process sets up before its work: Prefect's settings and the temporary
Prefect server (`prefect_settings`, `prefect_server`), and the garbage collector around the heavy imports
(`gc_tuning`)."""
