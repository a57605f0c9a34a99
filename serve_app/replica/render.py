"""A chat's prompt as the checkpoint's own template renders it, and what the rendering tells the rest of the
request (in the engine process, on its reader thread).

- An assistant turn with text and tool calls: the published Gemma-4 templates (April, 07-09) render its calls
  first and its text after the tool responses, then close the turn, so a prompt continuing that turn (the
  tool loop's next step) ends with no model turn open. We split such a turn into its text, then its calls (the
  order the model wrote them in, and the 07-09 template continues one model turn across the two); if the
  rendering still leaves no model turn open (the April template closes a text-only turn), the text is dropped
  instead: the calls and their results are what the next step needs.
- Whether the prompt ends inside a thought channel (the 07-09 template opens `<|channel>thought\\n` after a
  tool response when thinking is on): then the model's reasoning comes with no opening marker, so the output
  parser starts inside the channel, and a forced call or JSON takes the grammar variant that first closes it.
Decided from the rendered text, never from which template it is.
"""

from __future__ import annotations

from neuron_workers.errors import UserError

TURN, TURN_END, CHANNEL, CHANNEL_END = "<|turn>", "<turn|>", "<|channel>", "<channel|>"


def model_turn_open(text: str) -> bool:
    """The prompt ends inside a model turn (the last turn opened is the model's, and it was not closed)."""
    i = text.rfind(TURN)
    return text.startswith(TURN + "model", i) and TURN_END not in text[i:] if i >= 0 else False


def ends_in_thought(text: str) -> bool:
    """The prompt ends inside a channel it opened (`<|channel>thought\\n` without its `<channel|>`)."""
    i = text.rfind(CHANNEL)
    return i >= 0 and CHANNEL_END not in text[i:]


def split_turns(messages: list[dict]) -> list[dict]:
    """Each assistant turn with text and calls as two: its text, then its calls (and its reasoning)."""
    out = []
    for m in messages:
        if m.get("role") == "assistant" and m.get("tool_calls") and (m.get("content") or "").strip():
            out += [{"role": "assistant", "content": m["content"]}, {**m, "content": None}]
        else:
            out.append(m)
    return out


def without_text_of_calls(messages: list[dict]) -> list[dict]:
    return [{**m, "content": None} if m.get("role") == "assistant" and m.get("tool_calls") else m for m in messages]


def render(engine, messages: list[dict], tools: list[dict] | None, **template_kwargs) -> str:
    """The prompt text for `messages` (text-plus-calls turns split, or their text dropped: see above)."""
    try:
        return _render(engine, messages, tools, **template_kwargs)
    except RecursionError:  # the template walks tool-call arguments recursively
        raise UserError("the messages are nested too deeply for the chat template to render",
                        param="messages") from None


def _render(engine, messages: list[dict], tools: list[dict] | None, **template_kwargs) -> str:
    split = split_turns(messages)
    text = engine.render_chat(split, tools, **template_kwargs)
    if split != messages and not model_turn_open(text) and messages[-1].get("role") == "tool":
        text = engine.render_chat(without_text_of_calls(messages), tools, **template_kwargs)
    return text
