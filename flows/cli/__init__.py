"""The `gptpipe` command line: one module per group of commands, the shared options, the entry point in
`main`.
"""
