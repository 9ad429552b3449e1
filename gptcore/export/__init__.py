"""A trained model as files: the plain model files a logged model carries, and the Hugging Face export."""
