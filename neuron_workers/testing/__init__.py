"""Tiny random-weight Gemma-4 checkpoints in the real on-disk layouts (`tiny`) with a small tokenizer that
carries Gemma-4's control tokens and chat format (`tiny_tokenizer`): the tests' models and the embedded
default that `configs/local.yaml` serves."""
