"""Evaluation after training: held-out figures, the quantization trade-off, and the comparison of two runs."""
