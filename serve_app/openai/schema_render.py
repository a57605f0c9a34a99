"""A tool's parameter schema as the Gemma-4 chat templates can render it (for the prompt only: the request's
grammar is built from the original schema).

The published templates render a declaration from `description`, `type`, `properties`, `required`,
`nullable`, string `enum` and array `items`, and nothing else; fed anything else they go wrong: parameters
without `"type"` leave a brace unclosed, `type: ["string", "null"]` renders as a Python list, and an
`additionalProperties` schema renders as if it were a property. So, recursively:

- an object schema without `type` gets `"type": "object"`; a type list becomes its first non-null type, with
  `nullable: true` when it held `"null"` (other types are named in the description);
- `anyOf` / `oneOf` of plain types fold the same way; `$ref` to `#/$defs` / `#/definitions` is inlined (once:
  a recursive reference becomes a free object);
- keywords the templates cannot render are dropped, the ones that tell the model something (bounds, lengths,
  pattern, format, default, a non-string enum, free-form values) folded into the description.
"""

from __future__ import annotations

import json

RENDERED = ("description", "type", "properties", "required", "nullable", "enum", "items")
TOLD = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength", "maxLength",
        "pattern", "format", "default", "minItems", "maxItems", "const")


def for_template(schema, root: dict | None = None, seen: frozenset = frozenset()) -> dict:
    """`schema` rewritten to what the templates render faithfully."""
    if not isinstance(schema, dict):
        return {"type": "object"}
    root = schema if root is None else root
    s = dict(schema)
    ref = s.pop("$ref", None)
    if isinstance(ref, str) and ref.startswith("#/") and ref not in seen:
        target = resolve(root, ref)
        if isinstance(target, dict):
            return for_template({**target, **s}, root, seen | {ref})
    notes = []
    for key in ("anyOf", "oneOf"):
        alts = s.pop(key, None)
        if isinstance(alts, list) and alts and "type" not in s:
            s["type"] = [a.get("type", "object") if isinstance(a, dict) else "object" for a in alts]
            s["type"] = [t for ts in s["type"] for t in (ts if isinstance(ts, list) else [ts])]
    t = s.get("type")
    if isinstance(t, list):
        real = [x for x in t if x != "null"] or ["string"]
        s["type"] = real[0]
        if "null" in t:
            s["nullable"] = True
        if len(real) > 1:
            notes.append("type: " + " or ".join(real))
    if "type" not in s:
        s["type"] = "object" if "properties" in s or "additionalProperties" in s or ref else "string"
    if s["type"] != "string" and "enum" in s:
        notes.append("one of: " + json.dumps(s.pop("enum")))
    notes += [f"{k}: {json.dumps(s[k])}" for k in TOLD if k in s]
    extra = s.get("additionalProperties")
    if isinstance(extra, dict) and not s.get("properties"):
        notes.append("any keys, values of type " + str(for_template(extra, root, seen).get("type")))
    out = {k: s[k] for k in RENDERED if k in s}
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: for_template(v, root, seen) for k, v in out["properties"].items()}
    if isinstance(out.get("items"), dict):
        out["items"] = for_template(out["items"], root, seen)
    elif "items" in out:
        del out["items"]
    if notes:
        out["description"] = "; ".join([*(x for x in [out.get("description")] if x), *notes])
    return out


def resolve(root: dict, ref: str):
    node = root
    for part in ref[2:].split("/"):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def tool_for_template(tool: dict) -> dict:
    """An OpenAI tool definition with its parameters rewritten by `for_template`."""
    f = dict(tool.get("function") or {})
    if isinstance(f.get("parameters"), dict):
        f["parameters"] = for_template(f["parameters"])
    return {**tool, "function": f}
