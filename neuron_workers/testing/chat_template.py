"""Our Gemma-4 chat template for the tiny checkpoints, written to render exactly what the published Gemma-4
templates render (checked string by string against them on a battery of conversations:
tests/serve/openai/test_chat_template.py), in three versions:

- "0709": the canonical template headed "Published: 2026-07-09" (E2B / E4B / 12B). After a tool response
  with thinking on, the prompt ends inside the model's thought channel (`<|channel>thought\\n`); earlier
  reasoning (`reasoning` / `reasoning_content`) after the last user message is replayed; None renders `null`.
- "0709-31b": the same, plus an empty thought channel after `<|turn>model\\n` when thinking is off (the
  26B / 31B template).
- "april": the April sync (vLLM's example template): the empty thought channel when thinking is off, no open
  thought after a tool response, reasoning replayed only on turns with tool calls, None renders `None`, and
  an assistant turn's text after its tool responses closes the turn.

Values use Gemma's own syntax: bare keys in `dictsort` order (case-insensitive), strings between `<|"|>`,
types upper-cased in declarations. Media items of a content list render as the published templates write them:
`<|image|>` / `<|audio|>` / `<|video|>` in place, between the text items (07-09: types `image` / `image_url`,
`audio` / `input_audio`, and after a tool response's block too; April: `image` / `audio`, none in tool responses,
and a media item in a message's content ends its tool-call state: the turn closes and the generation prompt follows;
every version: text items trimmed, thinking stripped from the model's; none in the first system message, whose
items render their text only, each trimmed plus a space). Our code, not a copy: the macros are organised
differently.
"""

from __future__ import annotations

Q = '<|"|>'

_VALUE = """
{%- macro value(v, quote_keys=true) -%}
  {%- if v is none -%}{{ NULL }}
  {%- elif v is string -%}<|"|>{{ v }}<|"|>
  {%- elif v is boolean -%}{{ 'true' if v else 'false' }}
  {%- elif v is mapping -%}{{ '{' }}
    {%- for k, x in v | dictsort -%}
      {{- ',' if not loop.first }}{{ '<|"|>' ~ k ~ '<|"|>' if quote_keys else k }}:{{ value(x, quote_keys) }}
    {%- endfor -%}}
  {%- elif v is sequence -%}[
    {%- for x in v -%}{{ ',' if not loop.first }}{{ value(x, quote_keys) }}{%- endfor -%}]
  {%- else -%}{{ v }}
  {%- endif -%}
{%- endmacro -%}
"""

# a declaration's properties: each `name:{description,enum|items,nullable,properties,required,type}`
_PROPS = """
{%- macro quoted_list(xs) -%}[{%- for x in xs -%}{{ ',' if not loop.first }}<|"|>{{ x }}<|"|>{%- endfor -%}]{%- endmacro -%}
{%- macro items(it) -%}
  {%- set out = namespace(s='') -%}
  {%- for k, x in it | dictsort -%}
    {%- if x is not none -%}
      {%- if k == 'properties' -%}
        {%- set out.s = out.s ~ (',' if out.s) ~ 'properties:{' ~ (props(x, it['required'] | default([])) if x is mapping else '') ~ '}' -%}
      {%- elif k == 'required' -%}{%- set out.s = out.s ~ (',' if out.s) ~ 'required:' ~ quoted_list(x) -%}
      {%- elif k == 'type' -%}
        {%- set out.s = out.s ~ (',' if out.s) ~ 'type:' ~ value(x | upper if x is string else x | map('upper') | list) -%}
      {%- else -%}{%- set out.s = out.s ~ (',' if out.s) ~ k ~ ':' ~ value(x) -%}
      {%- endif -%}
    {%- endif -%}
  {%- endfor -%}{{ out.s }}
{%- endmacro -%}
{%- macro prop(v) -%}
  {%- set t = v['type'] | upper -%}
  {%- set out = namespace(s='') -%}
  {%- if v['description'] -%}{%- set out.s = out.s ~ (',' if out.s) ~ 'description:<|"|>' ~ v['description'] ~ '<|"|>' -%}{%- endif -%}
  {%- if t == 'STRING' and v['enum'] -%}{%- set out.s = out.s ~ (',' if out.s) ~ 'enum:' ~ value(v['enum']) -%}
  {%- elif t == 'ARRAY' and v['items'] is mapping and v['items'] -%}
    {%- set out.s = out.s ~ (',' if out.s) ~ 'items:{' ~ items(v['items']) ~ '}' -%}
  {%- endif -%}
  {%- if v['nullable'] -%}{%- set out.s = out.s ~ (',' if out.s) ~ 'nullable:true' -%}{%- endif -%}
  {%- if t == 'OBJECT' -%}
    {%- if v['properties'] is defined and v['properties'] is mapping -%}
      {%- set out.s = out.s ~ (',' if out.s) ~ 'properties:{' ~ props(v['properties'], v['required'] | default([])) ~ '}' -%}
    {%- elif v is mapping -%}
      {%- set out.s = out.s ~ (',' if out.s) ~ 'properties:{' ~ props(v, v['required'] | default([]), true) ~ '}' -%}
    {%- endif -%}
    {%- if v['required'] -%}{%- set out.s = out.s ~ (',' if out.s) ~ 'required:' ~ quoted_list(v['required'] | default([])) -%}{%- endif -%}
  {%- endif -%}
  {%- set out.s = out.s ~ (',' if out.s) ~ 'type:<|"|>' ~ t ~ '<|"|>' -%}{{ out.s }}
{%- endmacro -%}
{%- macro props(ps, required, skip_standard=false) -%}
  {%- set out = namespace(s='') -%}
  {%- for k, v in ps | dictsort -%}
    {%- if not skip_standard or k not in ['description', 'type', 'properties', 'required', 'nullable'] -%}
      {%- set out.s = out.s ~ (',' if out.s) ~ k ~ ':{' ~ prop(v) ~ '}' -%}
    {%- endif -%}
  {%- endfor -%}{{ out.s }}
{%- endmacro -%}
{%- macro declaration(f) -%}
  declaration:{{ f['name'] }}{description:<|"|>{{ f['description'] }}<|"|>
  {%- set p = f['parameters'] -%}
  {%- if p -%},parameters:{{ '{' }}
    {%- if p['properties'] -%}properties:{ {{- props(p['properties'], p['required']) -}} },{%- endif -%}
    {%- if p['required'] -%}required:{{ quoted_list(p['required']) }},{%- endif -%}
    {%- if p['type'] -%}type:<|"|>{{ p['type'] | upper }}<|"|>}{%- endif -%}
  {%- endif -%}
  {%- if 'response' in f -%},response:{{ '{' }}
    {%- if f['response']['description'] -%}description:<|"|>{{ f['response']['description'] }}<|"|>,{%- endif -%}
    {%- if f['response']['type'] | upper == 'OBJECT' -%}type:<|"|>{{ f['response']['type'] | upper }}<|"|>}{%- endif -%}
  {%- endif -%}}
{%- endmacro -%}
"""

_TURNS = """
{%- macro unthought(text) -%}
  {%- set kept = namespace(s='') -%}
  {%- for part in text.split('<channel|>') -%}{%- set kept.s = kept.s ~ part.split('<|channel>')[0] -%}{%- endfor -%}
  {{- kept.s | trim -}}
{%- endmacro -%}
{%- macro placeholder(p) -%}
  {%- if p.get('type') in IMAGE_TYPES -%}<|image|>
  {%- elif p.get('type') in AUDIO_TYPES -%}<|audio|>
  {%- elif p.get('type') == 'video' -%}<|video|>
  {%- endif -%}
{%- endmacro -%}
{%- macro media_of(content) -%}
  {%- if content is sequence and content is not string -%}{%- for p in content -%}{{ placeholder(p) }}{%- endfor -%}{%- endif -%}
{%- endmacro -%}
{%- macro text_of(content, model) -%}
  {%- if content is string -%}{{ unthought(content) if model else content | trim }}
  {%- elif content is sequence -%}
    {%- for p in content -%}
      {%- if p.get('type') == 'text' -%}{{ unthought(p['text']) if model else p['text'] | trim }}
      {%- else -%}{{ placeholder(p) }}
      {%- endif -%}
    {%- endfor -%}
  {%- endif -%}
{%- endmacro -%}
{%- macro response(name, body) -%}<|tool_response>response:{{ name ~ '{' }}
  {%- if body is mapping -%}
    {%- for k, x in body | dictsort -%}{{ ',' if not loop.first }}{{ k }}:{{ value(x, false) }}{%- endfor -%}
  {%- else -%}value:{{ value(body, false) }}
  {%- endif -%}}<tool_response|>
{%- endmacro -%}
{%- macro tool_text(parts) -%}
  {%- for p in parts if p.get('type') == 'text' -%}{{ p.get('text') or '' }}{%- endfor -%}
{%- endmacro -%}
"""

_BODY = """
{%- set thinking = enable_thinking | default(false) -%}
{%- set st = namespace(last='', prev_role=none, last_user=-1) -%}
{{- bos_token -}}
{%- set chat = messages -%}
{%- set has_system = messages and messages[0]['role'] in ['system', 'developer'] -%}
{%- if thinking or tools or has_system -%}{{ '<|turn>system\\n' }}{{ '<|think|>\\n' if thinking }}
  {%- if has_system -%}
    {%- set sys = messages[0]['content'] -%}
    {%- if sys is string -%}{{ sys | trim }}
    {%- elif sys is sequence -%}{%- for p in sys -%}{{ p['text'] | trim ~ ' ' }}{%- endfor -%}
    {%- endif -%}
    {%- set chat = messages[1:] -%}
  {%- endif -%}
  {%- for t in tools or [] -%}<|tool>{{ declaration(t['function']) | trim }}<tool|>{%- endfor -%}{{ '<turn|>\\n' }}
{%- endif -%}
{%- for m in chat -%}{%- if m['role'] == 'user' -%}{%- set st.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}
{%- for m in chat -%}{%- if m['role'] != 'tool' -%}
  {%- set i = loop.index0 -%}
  {%- set st.last = '' -%}
  {%- set model = m['role'] in ['assistant', 'model'] -%}
  {%- set role = 'model' if m['role'] == 'assistant' else m['role'] -%}
  {%- if not (role == 'model' and st.prev_role == 'assistant') -%}{{ '<|turn>' ~ role ~ '\\n' }}{%- endif -%}
  {%- set calls = m.get('tool_calls') -%}
  {%- set thought = m.get('reasoning') or m.get('reasoning_content') -%}
  {%- if thought and (REPLAY) -%}{{ '<|channel>thought\\n' ~ thought ~ '\\n<channel|>' }}{%- endif -%}
  {%- for c in calls or [] -%}<|tool_call>call:{{ c['function']['name'] ~ '{' }}
    {%- set a = c['function']['arguments'] -%}
    {%- if a is mapping -%}{%- for k, x in a | dictsort -%}{{ ',' if not loop.first }}{{ k }}:{{ value(x, false) }}{%- endfor -%}
    {%- elif a is string -%}{{ a }}
    {%- endif -%}}<tool_call|>
    {%- set st.last = 'call' -%}
  {%- endfor -%}
  {%- set answered = namespace(any=false, open=true) -%}
  {%- if calls -%}
    {%- for r in chat[i + 1:] -%}
      {%- if r['role'] != 'tool' -%}{%- set answered.open = false -%}
      {%- elif answered.open -%}
        {%- set who = namespace(name=r.get('name') or 'unknown') -%}
        {%- for c in calls if c.get('id') == r.get('tool_call_id') -%}{%- set who.name = c['function']['name'] -%}{%- endfor -%}
        {%- set body = r.get('content') -%}
        {%- set parts = body is sequence and body is not string and body is not mapping -%}
        {{- response(who.name, tool_text(body) if parts else body) -}}
        {%- if parts and TOOL_MEDIA -%}{{ media_of(body) }}{%- endif -%}
        {%- set answered.any = true -%}{%- set st.last = 'response' -%}
      {%- endif -%}
    {%- endfor -%}
  {%- endif -%}
  {%- set said = text_of(m.get('content'), model) -%}{{ said }}
  {%- if MEDIA_ENDS_TOOLS and media_of(m.get('content')) -%}{%- set st.last = 'media' -%}{%- endif -%}
  {%- set after = namespace(role=none) -%}
  {%- for r in chat[i + 1:] if r['role'] != 'tool' and after.role is none -%}{%- set after.role = r['role'] -%}{%- endfor -%}
  {%- if st.last == 'call' and not answered.any -%}<|tool_response>
  {%- elif CONTINUES -%}
  {%- elif not (CLOSE_EXCEPT) -%}{{ '<turn|>\\n' }}
  {%- endif -%}
  {%- set st.prev_role = m['role'] -%}
{%- endif -%}{%- endfor -%}
{%- if add_generation_prompt -%}
  {%- if st.last not in ['response', 'call'] -%}{{ '<|turn>model\\n' }}
    {%- if EMPTY_THOUGHT and not thinking -%}{{ '<|channel>thought\\n<channel|>' }}{%- endif -%}
  {%- elif st.last == 'response' and thinking and OPEN_THOUGHT -%}{{ '<|channel>thought\\n' }}
  {%- endif -%}
{%- endif -%}
"""

VARIANTS = {
    "0709": {"NULL": "'null'", "REPLAY": "i > st.last_user or (preserve_thinking | default(false) and calls)",
             "CONTINUES": "role == 'model' and after.role == 'assistant' and (not calls or answered.any)",
             "CLOSE_EXCEPT": "answered.any and not said | trim and after.role is none",
             "EMPTY_THOUGHT": "false", "OPEN_THOUGHT": "true", "IMAGE_TYPES": "['image', 'image_url']",
             "AUDIO_TYPES": "['audio', 'input_audio']", "TOOL_MEDIA": "true", "MEDIA_ENDS_TOOLS": "false"},
    "april": {"NULL": "'None'", "REPLAY": "i > st.last_user and calls", "CONTINUES": "false",
              "CLOSE_EXCEPT": "answered.any and not said | trim", "EMPTY_THOUGHT": "true", "OPEN_THOUGHT": "false",
              "IMAGE_TYPES": "['image']", "AUDIO_TYPES": "['audio']", "TOOL_MEDIA": "false",
              "MEDIA_ENDS_TOOLS": "true"},
}
VARIANTS["0709-31b"] = {**VARIANTS["0709"], "EMPTY_THOUGHT": "true"}


def chat_template(variant: str = "0709") -> str:
    """The Jinja source of one version (a key of VARIANTS)."""
    v = VARIANTS[variant]
    body = _TURNS + _BODY
    for name in ("REPLAY", "CONTINUES", "CLOSE_EXCEPT", "EMPTY_THOUGHT", "OPEN_THOUGHT", "IMAGE_TYPES", "AUDIO_TYPES",
                 "TOOL_MEDIA", "MEDIA_ENDS_TOOLS"):
        body = body.replace(name, v[name])
    source = "{%- set NULL = " + v["NULL"] + " -%}" + _VALUE + _PROPS + body
    return "".join(line.strip() for line in source.split("\n"))  # newlines in the output are all explicit
