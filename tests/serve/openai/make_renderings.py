"""Re-render data/gemma4_renderings.json from the published Gemma-4 templates (not run by the tests: it needs the
templates, which the repository does not carry). Usage:

    python tests/serve/openai/make_renderings.py 0709=PATH 0709-31b=PATH april=PATH

with the 07-09 E2B and 31B templates (ollama's model/renderers/testdata/gemma4_e2b_chat_template.jinja2 and
gemma4_31b_chat_template.jinja2) and the April template (vLLM's examples/tool_chat_template_gemma4.jinja)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from neuron_workers.testing.tiny_tokenizer import build_tokenizer

from chat_battery import CASES

OUT = Path(__file__).with_name("data") / "gemma4_renderings.json"


def render(tok, template: str, case: dict) -> str:
    kw = {k: v for k, v in case.items() if k not in ("messages", "tools")}
    return tok.apply_chat_template(case["messages"], tools=case.get("tools"), chat_template=template,
                                   tokenize=False, add_generation_prompt=True, **kw)


def main(args: list[str]) -> None:
    tok = build_tokenizer()
    out = {}
    for arg in args:
        name, path = arg.split("=", 1)
        template = Path(path).read_text()
        out[name] = {case: render(tok, template, c) for case, c in CASES.items()}
    OUT.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
