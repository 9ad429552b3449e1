"""Chat: conversations as data, and the corpus of them built from the standard library's docstrings."""
