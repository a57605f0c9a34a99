"""A tool's arguments as Lark rules in Gemma-4's own value syntax, for every JSON Schema the model can be held
to: the arguments the model writes re-render unchanged through the chat template.

- Keys bare, in the order the templates render them (`dictsort`: case-insensitive), strings between `<|"|>`,
  numbers and booleans as JSON, `null` (the 07-09 template's spelling).
- Strings may hold any text but the spellings of Gemma-4's control tokens (so `a < b`, HTML and code pass,
  while no string can end itself or imitate a call), and no control characters but tab and newline;
  `minLength` / `maxLength`, `pattern` (a regex, anchored or searched as JSON Schema says), `format` (date,
  time, date-time, uuid, email, ipv4; another format is refused, as llguidance refuses one it does not know).
- `enum` / `const` (any JSON value), `anyOf` / `oneOf` (with their sibling keywords), `allOf` (merged),
  `type` lists, `nullable`, `$ref` to `#/$defs/...` or `#/definitions/...` (one rule per definition, so
  recursive schemas work), objects with `properties` / `required`, free-form objects (no `properties`, or
  `additionalProperties` a schema) and arrays (`items`, `minItems` / `maxItems`) through a generic value rule.
- A keyword that changes what is valid and that a grammar here cannot hold (`not`, `if`, `prefixItems`,
  `uniqueItems`, `patternProperties`, ...) is refused by name: `Unsupported`, a 400 on `tools`.
"""

from __future__ import annotations

import json
import re

ANNOTATIONS = {"description", "title", "default", "examples", "$schema", "$id", "$comment", "deprecated",
               "readOnly", "writeOnly", "strict", "$defs", "definitions", "format", "contentMediaType",
               "contentEncoding"}
UNSUPPORTED = {"not", "if", "then", "else", "prefixItems", "uniqueItems", "contains", "minContains", "maxContains",
               "patternProperties", "propertyNames", "dependentRequired", "dependentSchemas", "minProperties",
               "maxProperties", "unevaluatedProperties", "unevaluatedItems", "$dynamicRef"}
CONTROL = r'<\|[a-z_"]*\|?>|<[a-z_]+\|>|<(eos|bos|pad)>'  # the control tokens' spellings (markers.CONTROL)
TEXT_CHARS = r"[^\x00-\x08\x0b-\x1f]"
FORMATS = {"date": r"[0-9]{4}-[0-9]{2}-[0-9]{2}",
           "time": r"[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2})?",
           "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
           "email": r"[^@\s<>]+@[^@\s<>]+\.[^@\s<>]+",
           "ipv4": r"((25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"}
FORMATS["date-time"] = FORMATS["date"] + "T" + FORMATS["time"]
KEY = re.compile(r"[^\s:,{}\[\]<>\"]([^:,{}\[\]<>\"]*[^\s:,{}\[\]<>\"])?\Z")  # what a bare key can be


def inline_json(schema: dict) -> str:
    """An llguidance `%json` sub-grammar without free whitespace (a flexible one breaks its lexer between
    native tokens)."""
    return "%json " + json.dumps({**schema, "x-guidance": {"whitespace_flexible": False}})


class Unsupported(ValueError):
    """The schema uses something a native grammar cannot hold (the message names it)."""


def dictsort_key(item) -> str:
    return item[0].lower()


def native_text(v) -> str:
    """A JSON value in the template's spelling of tool-call arguments (bare keys, sorted)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'<|"|>{v}<|"|>'
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{native_text(x)}" for k, x in sorted(v.items(), key=dictsort_key)) + "}"
    if isinstance(v, list):
        return "[" + ",".join(native_text(x) for x in v) + "]"
    return json.dumps(v)


def literal(v) -> str:
    """Lark for exactly `v` (special tokens between quoted text)."""
    if isinstance(v, str) and re.search(CONTROL, v):
        raise Unsupported(f"the value {v!r} holds a control token's spelling")
    parts = re.split(r'(<\|"\|>)', native_text(v))
    return " ".join('<|"|>' if p == '<|"|>' else json.dumps(p) for p in parts if p)


class NativeArgs:
    """Lark rules for one tool's arguments; `rules` collects them, names start with `prefix`."""

    def __init__(self, prefix: str, root: dict):
        self.prefix, self.rules, self.n, self.root, self.refs = prefix, [], 0, root, {}

    def rule(self, body: str, terminal: bool = False, name: str | None = None) -> str:
        self.n += 1
        name = name or f"{self.prefix}_{self.n}"
        name = name.upper() if terminal else name
        self.rules.append(f"{name}: {body}")
        return name

    def value(self, s) -> str:
        if s is True or s == {}:
            return self.any()
        if not isinstance(s, dict):
            raise Unsupported("a schema that allows no value (`false`)")
        bad = sorted(set(s) & UNSUPPORTED)
        if bad:
            raise Unsupported(f"the keyword `{bad[0]}`")
        if "$ref" in s:
            return self.ref(s)
        if "allOf" in s:
            return self.value(merged(s))
        if s.get("nullable") is True:
            return self.rule(f"{self.value({k: v for k, v in s.items() if k != 'nullable'})} | \"null\"")
        if "enum" in s or "const" in s:
            values = s["enum"] if "enum" in s else [s["const"]]
            if not isinstance(values, list) or not values:
                raise Unsupported("an empty `enum`")
            return self.rule(" | ".join(literal(v) for v in values))
        for key in ("anyOf", "oneOf"):
            if key in s:
                rest = {k: v for k, v in s.items() if k != key}
                return self.rule(" | ".join(self.value({**rest, **x} if isinstance(x, dict) else x) for x in s[key]))
        t = s.get("type")
        if isinstance(t, list):
            return self.rule(" | ".join(self.value({**s, "type": x}) for x in t))
        return self.typed(t, s)

    def typed(self, t, s: dict) -> str:
        if t == "string":
            return self.string(s)
        if t in ("integer", "number", "boolean", "null"):
            return self.rule(inline_json({k: v for k, v in s.items() if k not in ANNOTATIONS}))
        if t == "object" or t is None and ("properties" in s or "additionalProperties" in s):
            return self.object(s)
        if t == "array" or t is None and "items" in s:
            return self.array(s)
        if t is None:
            return self.any()
        raise Unsupported(f"the type {t!r}")

    def ref(self, s: dict) -> str:
        path = s["$ref"]
        m = re.fullmatch(r"#/(\$defs|definitions)/([^/]+)", path) if isinstance(path, str) else None
        if m is None or not isinstance(self.root.get(m.group(1)), dict) or m.group(2) not in self.root[m.group(1)]:
            raise Unsupported(f"the reference {path!r} (only #/$defs/NAME and #/definitions/NAME)")
        if path not in self.refs:  # named before it is built: a recursive definition refers to itself
            self.refs[path] = name = f"{self.prefix}_ref{len(self.refs)}"
            self.rules.append(f"{name}: {self.value(self.root[m.group(1)][m.group(2)])}")
        return self.refs[path]

    def string(self, s: dict) -> str:
        lo, hi = s.get("minLength", 0), s.get("maxLength")
        if not isinstance(lo, int) or hi is not None and (not isinstance(hi, int) or hi < lo):
            raise Unsupported("string lengths that are not integers, or maxLength below minLength")
        fmt = s.get("format")
        if fmt is not None and fmt not in FORMATS:
            raise Unsupported(f"the format {fmt!r} (these are: {', '.join(sorted(FORMATS))})")
        shape = pattern_regex(s["pattern"]) if isinstance(s.get("pattern"), str) else FORMATS.get(fmt)
        if lo == 0 and hi == 0:
            return self.rule('<|"|> <|"|>')
        count = f"{{{lo},{'' if hi is None else hi}}}"
        parts = [f"/{TEXT_CHARS}{count}/", f"~/(.|\\n)*({CONTROL})(.|\\n)*/"] + ([f"/{shape}/"] if shape else [])
        text = self.rule(" & ".join(parts), terminal=True)
        return self.rule(f'<|"|> {text}? <|"|>' if lo == 0 and may_be_empty(shape) else f'<|"|> {text} <|"|>')

    def object(self, s: dict) -> str:
        props, required, extra = s.get("properties") or {}, s.get("required") or [], s.get("additionalProperties")
        if not isinstance(props, dict) or not isinstance(required, list) or set(required) - set(props):
            raise Unsupported("`required` names a property that `properties` does not declare")
        if not props:
            return self.any_object(extra if isinstance(extra, dict) else True) if extra is not False else '"{}"'
        bad = [k for k in props if not KEY.match(k)]
        if bad:
            raise Unsupported(f"the property name {bad[0]!r} (no spaces at its ends, none of :,{{}}[]<>\")")
        items = [(f"{json.dumps(k + ':')} {self.value(v)}", k in required)
                 for k, v in sorted(props.items(), key=dictsort_key)]
        # after[first]: the properties from i on, `first` when none was written yet; built from the last back
        after = {False: "", True: ""}
        for i in reversed(range(len(items))):
            body, req = items[i]
            nxt = {}
            for first in (False, True) if not any(r for _, r in items[:i]) else (False,):
                take = " ".join(x for x in ("" if first else '","', body, after[False]) if x)
                nxt[first] = self.rule(take if req else f"{take} | {after[first] or chr(34) * 2}")
            after = {True: "", **nxt}
        return self.rule(f'"{{" {after[True]} "}}"')

    def array(self, s: dict) -> str:
        lo, hi = s.get("minItems", 0), s.get("maxItems")
        if not isinstance(lo, int) or hi is not None and (not isinstance(hi, int) or hi < lo):
            raise Unsupported("array lengths that are not integers, or maxItems below minItems")
        if hi == 0:
            return self.rule('"[]"')
        v = self.value(s.get("items", True))
        more = f'("," {v}){{{max(lo - 1, 0)},{"" if hi is None else hi - 1}}}'
        return self.rule(f'"[" {v} {more} "]"' if lo else f'"[" ({v} {more})? "]"')

    def any(self) -> str:
        """Any JSON value, natively (free-form keys unsorted: a grammar cannot sort keys it does not know)."""
        name = f"{self.prefix}_any"
        if name not in self.refs.values():
            self.refs["#any"] = name
            text = self.rule(f"/{TEXT_CHARS}+/ & ~/(.|\\n)*({CONTROL})(.|\\n)*/", terminal=True)
            key = self.rule(r"/[A-Za-z_][A-Za-z0-9_.-]*/", terminal=True)
            number = inline_json({"type": "number"})
            self.rules += [f'{name}: <|"|> {text}? <|"|> | {number} | "true" | "false" | "null"'
                           f' | "{{" ({key} ":" {name} ("," {key} ":" {name})*)? "}}"'
                           f' | "[" ({name} ("," {name})*)? "]"']
        return name

    def any_object(self, values) -> str:
        v = self.value(values)
        key = self.rule(r"/[A-Za-z_][A-Za-z0-9_.-]*/", terminal=True)
        return self.rule(f'"{{" ({key} ":" {v} ("," {key} ":" {v})*)? "}}"')


def pattern_regex(p: str) -> str:
    """A JSON Schema `pattern` (searched, unless anchored) as a regex the whole string must match."""
    head = "" if p.startswith("^") else "(.|\\n)*"
    tail = "" if p.endswith("$") and not p.endswith("\\$") else "(.|\\n)*"
    core = p[1 if p.startswith("^") else 0: len(p) - (0 if tail else 1)]
    return f"{head}({core}){tail}".replace("/", "\\/")


def may_be_empty(shape: str | None) -> bool:
    if not shape:
        return True
    try:
        return re.fullmatch(shape.replace("\\/", "/"), "") is not None
    except re.error:  # a regex Python reads differently: let the empty string through only if it is asked
        return False


def merged(s: dict) -> dict:
    """`allOf` folded into one schema: properties and required united; any other keyword must agree."""
    out = {k: v for k, v in s.items() if k != "allOf"}
    for part in s["allOf"]:
        if not isinstance(part, dict):
            raise Unsupported("an `allOf` part that is not an object schema")
        for k, v in part.items():
            if k == "properties":
                out["properties"] = {**out.get("properties", {}), **v}
            elif k == "required":
                out["required"] = sorted(set(out.get("required", [])) | set(v))
            elif k in out and out[k] != v and k not in ANNOTATIONS:
                raise Unsupported(f"`allOf` parts that disagree on `{k}`")
            else:
                out[k] = v
    return out
