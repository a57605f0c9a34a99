"""A small byte-level BPE tokenizer (vocab 512) with Gemma-4's control tokens at their real ids and the
Gemma-4 chat format, for the tiny checkpoints. Trained deterministically from the text below."""

from __future__ import annotations

from neuron_workers.testing.chat_template import chat_template

CORPUS = """\
The quick brown fox jumps over the lazy dog. Hello, world! How are you today?
Gemma is a family of open models. This server runs them on Inferentia with Ray Serve.
Once upon a time there was a small model that wanted to talk. It said hello to everyone it met.
What is the capital of France? The capital of France is Paris. What is two plus two? It is four.
Tell me a story about the sea, the sky and the stars. The night was long and the wind was cold.
def main(): print("hello") return 0  # code, numbers 0 1 2 3 4 5 6 7 8 9 and symbols: + - * / = < > ( ) [ ]
Please write a short poem. Roses are red, violets are blue, tokens are many, and layers are too.
"""
SPECIAL = {0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>", 46: "<|tool>", 47: "<tool|>", 48: "<|tool_call>",
           49: "<tool_call|>", 50: "<|tool_response>", 51: "<tool_response|>", 52: '<|"|>', 98: "<|think|>",
           67: "<|image>", 68: "<image|>", 69: "<|image|>", 70: "<|audio>", 71: "<audio|>", 79: "<|audio|>",
           80: "<|video|>", 100: "<|channel>", 101: "<channel|>", 105: "<|turn>", 106: "<turn|>"}
# the media control tokens at free ids of the tiny vocabulary (the real ones are 255999, 258882, 258880, 256000,
# 258883, 258881, 258884); the tiny configs' token ids name these (tiny.MEDIA_IDS)
MEDIA_TOKENS = {"boi_token": "<|image>", "eoi_token": "<image|>", "image_token": "<|image|>",
                "boa_token": "<|audio>", "eoa_token": "<audio|>", "audio_token": "<|audio|>"}
# Gemma-4's chat format: our template rendering what the published 07-09 template renders (chat_template.py)
CHAT_TEMPLATE = chat_template("0709")


def build_tokenizer(vocab_size: int = 512, template: str = "0709"):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    top = max(SPECIAL) + 1
    specials = [SPECIAL.get(i, f"<unused{i}>") for i in range(top)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS.splitlines(), trainer)
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A $B",
                                                       special_tokens=[("<bos>", 2)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>", unk_token="<unk>", extra_special_tokens=MEDIA_TOKENS)
    fast.chat_template = chat_template(template)
    return fast
