"""The parameter file: its schema (`schema`), reading it (`loading`), a sweep's trials (`sweep`), and the
training jobs gptcore runs from it (`jobs`)."""
