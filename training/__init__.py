"""Offline data pipeline, tokenizer and model training for vllm-anyorder (see training/README.md)."""
