"""The pipeline layer, between the flows and gptcore: the parameter file (`params/`), the stages as cached
Prefect tasks (`stages/`, `pipeline`, `caching`, `results`), the one way a training starts
(`training_launch`), the device's slot (`device_slot`), progress shown to people (`progress_bar`,
`prefect_progress`), comparisons from a parameter file (`comparison`), and the MLflow side
(`tracking/`: where records go, how they get there, models and the registry)."""
