"""The GPT: its layers (`gpt`), the key-value cache generation uses, the chunked cross-entropy, and
quantization of a trained model.
"""
