"""A small byte-level BPE tokenizer (vocab 512) with Gemma-4's control tokens at their real ids and the
Gemma-4 chat format, for the tiny checkpoints. Trained deterministically from the text below."""

from __future__ import annotations

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
           100: "<|channel>", 101: "<channel|>", 105: "<|turn>", 106: "<turn|>"}
# Gemma-4's chat format: turns, `<|think|>` opening the system turn when `enable_thinking`, tool declarations
# in the system turn, tool calls and tool responses inside the model's turn (which goes on after a response),
# values in Gemma's own syntax (bare keys in sorted order, strings between `<|"|>`, types upper-cased).
CHAT_TEMPLATE = (
    "{%- macro val(v, key='') -%}"
    "{%- if v is mapping -%}{{ '{' }}{%- for k, x in v | dictsort -%}{{ k }}:{{ val(x, k) }}"
    "{{ ',' if not loop.last }}{%- endfor -%}{{ '}' }}"
    "{%- elif v is string -%}<|\"|>{{ v | upper if key == 'type' else v }}<|\"|>"
    "{%- elif v is sameas true -%}true{%- elif v is sameas false -%}false{%- elif v is none -%}null"
    "{%- elif v is iterable -%}[{%- for x in v -%}{{ val(x) }}{{ ',' if not loop.last }}{%- endfor -%}]"
    "{%- else -%}{{ v }}{%- endif -%}{%- endmacro -%}"
    "{{ bos_token }}"
    "{%- set sys = messages[0]['content'] if messages and messages[0]['role'] == 'system' else none -%}"
    "{%- if sys is not none or tools or enable_thinking -%}<|turn>system\n"
    "{% if enable_thinking %}<|think|>\n{% endif -%}{{ (sys or '') | trim }}"
    "{%- for t in tools or [] -%}{%- set f = t['function'] if 'function' in t else t -%}"
    "<|tool>declaration:{{ f['name'] }}{{ val({'description': f.get('description', ''),"
    " 'parameters': f.get('parameters', {})}) }}<tool|>{%- endfor -%}<turn|>\n{% endif -%}"
    "{%- set turns = messages[1:] if sys is not none else messages -%}{%- for m in turns -%}"
    "{%- set prev = loop.previtem['role'] if not loop.first else '' -%}"
    "{%- set nxt = loop.nextitem['role'] if not loop.last else '' -%}"
    "{%- if m['role'] == 'tool' -%}"
    "<|tool_response>response:{{ m.get('name') or 'unknown' }}{{ val({'value': m['content']}) }}<tool_response|>"
    "{%- if nxt and nxt not in ('tool', 'assistant') %}<turn|>\n{% endif -%}"
    "{%- else -%}"
    "{%- if not (m['role'] == 'assistant' and prev == 'tool') -%}"
    "<|turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{% endif -%}"
    "{{ (m['content'] or '') | trim }}"
    "{%- for c in m.get('tool_calls') or [] -%}{%- set f = c['function'] if 'function' in c else c -%}"
    "<|tool_call>call:{{ f['name'] }}{{ val(f['arguments']) }}<tool_call|>{%- endfor -%}"
    "{%- if nxt != 'tool' %}<turn|>\n{% endif -%}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt and (not messages or messages[-1]['role'] != 'tool') %}<|turn>model\n{% endif -%}")


def build_tokenizer(vocab_size: int = 512):
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
                                   pad_token="<pad>", unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    return fast
