"""Adapting a trained model to new text: low-rank adapters (LoRA) on its own linear layers."""
