"""Bad input through the real `gptpipe` command line: one clear line, a non-zero exit, nothing written."""
