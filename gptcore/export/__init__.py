"""A trained model as files: the plain model files a logged model carries, and the Hugging Face export
(GPT-2's layout in `hf`, the modern recipe as Llama or Qwen3 in `hf_llama`) and import (`hf_import`)."""
