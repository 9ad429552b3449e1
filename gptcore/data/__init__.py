"""From documents to batches: the corpus and its splits, tokenizer training, encoding, token files and the
batches read from them.
"""
