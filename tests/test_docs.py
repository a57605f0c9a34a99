"""The docs check: every relative link of README.md, ARCHITECTURE.md and docs/*.md resolves (the file exists, and
so does the heading an `#anchor` names, GitHub's way); every command of the README's fenced `bash` blocks that
starts with `python -m` or `curl` is mapped to the test that runs it (a command the map lacks, or a mapped test
that does not exist, fails); the README's requests are valid requests of the API and name models the local
config serves; the README's test command is the one `.ci/run` runs. Fast: no server, no model."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(```|~~~)(.*)$")
LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")

# Each README command (`python -m ...` / `curl ...` in a ```bash block, `&&`-chains split, continuation lines
# joined, leading VAR=value dropped), written as shlex splits and joins it -> the tests that run it.
COMMANDS = {
    "python -m serve_app.run configs/local.yaml": [
        "tests/serve/test_drain.py::test_signal_drains_in_flight_requests_then_exits",  # python -m serve_app.run
        "tests/test_docs.py::test_the_readme_configs_are_valid_serve_configs",
    ],
    "python -m pytest -q -n 2 --dist loadgroup": [
        "tests/test_docs.py::test_ci_runs_the_readme_test_command",
    ],
    "curl -s localhost:8000/v1/chat/completions -H 'Content-Type: application/json' -d '{\"model\": "
    "\"gemma-4-e4b-tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello!\"}], \"max_tokens\": 16, "
    "\"temperature\": 0}'": [
        "tests/serve/test_serve.py::test_openai_client_chat_and_completions",
        "tests/test_docs.py::test_readme_requests_are_valid_api_requests",
    ],
    "curl -s localhost:8000/v1/completions -H 'Content-Type: application/json' -d '{\"model\": "
    "\"gemma-4-12b-tiny\", \"prompt\": \"Once upon a time\", \"max_tokens\": 8, \"temperature\": 0}'": [
        "tests/serve/test_serve.py::test_openai_client_chat_and_completions",
        "tests/test_docs.py::test_readme_requests_are_valid_api_requests",
    ],
    "curl -sN localhost:8000/v1/chat/completions -H 'Content-Type: application/json' -d '{\"model\": "
    "\"gemma-4-e2b-tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 8, "
    "\"stream\": true, \"stream_options\": {\"include_usage\": true}}'": [
        "tests/serve/test_serve.py::test_streaming_is_incremental",
        "tests/test_docs.py::test_readme_requests_are_valid_api_requests",
    ],
    "curl -s localhost:8000/v1/chat/completions -H 'Content-Type: application/json' -d '{ \"model\": "
    "\"gemma-4-e2b-tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"}], \"tools\": "
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\", "
    "\"properties\": {\"city\": {\"type\": \"string\", \"maxLength\": 20}}, \"required\": [\"city\"], "
    "\"additionalProperties\": false}}}], \"tool_choice\": \"required\", \"parallel_tool_calls\": false}'": [
        "tests/serve/test_serve_agentic.py::test_forced_tool_calls",
        "tests/test_docs.py::test_readme_requests_are_valid_api_requests",
    ],
    'curl -s localhost:8000/v1/chat/completions -H \'Content-Type: application/json\' -d \'{"model": "gemma-'
    '4-e2b-tiny", "max_tokens": 12, "temperature": 0, "messages": [{"role": "user", "content": [{"type": '
    '"text", "text": "What is in this image?"}, {"type": "image_url", "image_url": {"url": "data:image/pn'
    'g;base64,iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVR42mO8o6HBwMDAxMDAwMDAAAAO7gEwnuiAAQA'
    'AAABJRU5ErkJggg=="}}]}]}\'': [
        "tests/serve/test_serve_media.py::test_every_model_takes_an_image_and_audio_and_counts_their_tokens",
        "tests/test_docs.py::test_readme_requests_are_valid_api_requests",
    ],
    'curl -s localhost:8000/v1/chat/completions -H \'Content-Type: application/json\' -d \'{"model": "gemma-'
    '4-e4b-tiny", "max_tokens": 12, "temperature": 0, "messages": [{"role": "user", "content": [{"type": '
    '"text", "text": "Transcribe:"}, {"type": "input_audio", "input_audio": {"format": "wav", "data": "Uk'
    'lGRsQAAABXQVZFZm10IBAAAAABAAEAQB8AAEAfAAABAAgAZGF0YaAAAACAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI'
    'CAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI'
    'CAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICA"}}]}]}\'': [
        "tests/serve/test_serve_media.py::test_every_model_takes_an_image_and_audio_and_counts_their_tokens",
        "tests/test_docs.py::test_readme_requests_are_valid_api_requests",
    ],
}


def prose(text: str) -> str:
    """The text outside fenced code blocks (a link or a `#` inside code is not one)."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append(re.sub(r"`[^`]*`", "``", line))  # inline code holds no links either
    return "\n".join(out)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in prose_lines_with_code(path):
        m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if m:
            s = slug(m.group(2))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


def prose_lines_with_code(path: Path) -> list[str]:
    """The lines outside fenced blocks, inline code kept (headings keep their backticked words)."""
    out, fenced = [], False
    for line in path.read_text().splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
        elif not fenced:
            out.append(line)
    return out


def links(path: Path) -> list[str]:
    text = "\n".join(prose_lines_with_code(path))
    text = re.sub(r"`[^`\n]*`", lambda m: "" if "](" not in m.group(0) else m.group(0), text)
    return LINK.findall(text)


def broken_links(path: Path) -> list[str]:
    bad, name = [], path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    for target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http(s):, mailto:: not relative
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            bad.append(f"{name}: {target} (no such file)")
        elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
            bad.append(f"{name}: {target} (no heading #{anchor})")
    return bad


def bash_blocks(text: str) -> list[str]:
    blocks, current, lang = [], None, ""
    for line in text.splitlines():
        m = FENCE.match(line.strip())
        if m and current is None:
            current, lang = [], m.group(2).strip()
        elif m:
            if lang in ("bash", "sh", "shell", "console"):
                blocks.append("\n".join(current))
            current = None
        elif current is not None:
            current.append(line)
    return blocks


def commands(text: str) -> list[str]:
    """The `python -m` and `curl` commands of the text's bash blocks, normalized (see COMMANDS)."""
    out = []
    for block in bash_blocks(text):
        pending = ""
        for line in block.replace("\\\n", " ").splitlines():
            pending += line + "\n"
            try:  # a quoted argument may run over several lines
                words = shlex.split(pending, comments=True)
            except ValueError:
                continue
            pending = ""
            words = [re.sub(r"\s*\n\s*", " ", w) for w in words]
            chain: list[list[str]] = [[]]
            for w in words:
                if w in ("&&", "||", ";", "|"):
                    chain.append([])
                else:
                    chain[-1].append(w)
            for cmd in chain:
                while cmd and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", cmd[0]):
                    cmd = cmd[1:]
                if cmd[:2] == ["python", "-m"] or cmd[:1] == ["curl"]:
                    out.append(shlex.join(cmd))
    return out


def test_slugs_and_links_are_read_as_github_does(tmp_path):
    assert slug("Prefix reuse (`prefix_cache`)") == "prefix-reuse-prefix_cache"
    assert slug("Kubernetes (EKS + KubeRay)") == "kubernetes-eks--kuberay"
    assert slug("Tools, JSON and thinking") == "tools-json-and-thinking"
    page = tmp_path / "p.md"
    page.write_text("# Top\n\n## Top\n\n[a](#top-1) [b](#nope) [c](q.md) [d](https://x.org/y#z)\n"
                    "```bash\n# not a heading\n[e](missing.md)\n```\n")
    bad = broken_links(page)
    assert [b.split(": ", 1)[1] for b in bad] == ["#nope (no heading #nope)", "q.md (no such file)"]


def test_there_are_at_least_five_docs_pages_each_saying_who_it_is_for():
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert len(pages) >= 5, pages
    for page in [*pages, ROOT / "ARCHITECTURE.md"]:
        head = "\n".join(page.read_text().splitlines()[:8])
        assert "**For**" in head, f"{page.name} does not open by saying who it is for"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    assert broken_links(page) == []


def test_the_readme_is_a_front_door():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, len(lines)
    top = "\n".join(lines[:60])
    assert "pip install torch==2.13.0 -e '.[serve]' && python -m serve_app.run configs/local.yaml" in top
    assert "pip install torch==2.13.0 -e '.[test]' && ruff check . && python -m pytest -q -n 2 --dist loadgroup" in top


def test_every_readme_command_is_mapped_to_a_test_that_exists():
    found = commands(README.read_text())
    assert found, "no python -m / curl command in the README's bash blocks"
    unmapped = [c for c in found if c not in COMMANDS]
    assert not unmapped, f"README commands no test is mapped to (add them to COMMANDS): {unmapped}"
    stale = [c for c in COMMANDS if c not in found]
    assert not stale, f"COMMANDS names commands the README no longer has: {stale}"
    for cmd, tests in COMMANDS.items():
        assert tests, cmd
        for ref in tests:
            path, *names = ref.split("::")
            source = (ROOT / path).read_text() if (ROOT / path).exists() else ""
            assert source, f"{ref}: no file {path}"
            assert re.search(rf"^\s*def {re.escape(names[-1])}\(", source, re.M), f"{ref}: no such test"
    for cmd in found:
        words = shlex.split(cmd)
        if words[:2] == ["python", "-m"]:
            assert importlib.util.find_spec(words[2]) is not None, f"{cmd}: no module {words[2]}"


def test_the_command_check_sees_chains_continuations_and_env():
    text = ("```bash\nFOO=1 python -m a.b --x 'y z'   # note\npip install q && python -m pytest -q\n"
            "curl -s h \\\n  -d '{\"a\": 1}'\nls\n```\n```python\npython -m nope\n```\n")
    assert commands(text) == ["python -m a.b --x 'y z'", "python -m pytest -q", "curl -s h -d '{\"a\": 1}'"]


def test_ci_runs_the_readme_test_command():
    """.ci/run says to keep its test command in step with the README's."""
    test_cmd = "python -m pytest -q -n 2 --dist loadgroup"
    assert test_cmd in commands(README.read_text())
    ci = (ROOT / ".ci" / "run").read_text()
    assert f"ruff check . && {test_cmd}" in ci
    assert "pip install -q torch==2.13.0 -e '.[test]'" in ci


def readme_requests() -> list[tuple[str, dict]]:
    out = []
    for cmd in commands(README.read_text()):
        words = shlex.split(cmd)
        if words[0] == "curl" and "-d" in words:
            url = next(w for w in words if "localhost:8000/" in w)
            out.append((url.split("localhost:8000", 1)[1], json.loads(words[words.index("-d") + 1])))
    return out


def test_readme_requests_are_valid_api_requests():
    from serve_app.openai.protocol import ChatRequest, CompletionRequest

    served = {m["name"] for m in app_args(ROOT / "configs" / "local.yaml")["models"]}
    requests = readme_requests()
    assert {path for path, _ in requests} == {"/v1/chat/completions", "/v1/completions"}
    for path, body in requests:
        model = ChatRequest if path == "/v1/chat/completions" else CompletionRequest
        model.model_validate(body)  # what the router does with the body (a 400 naming the field otherwise)
        assert body["model"] in served, f"{path}: the local config serves no {body['model']!r}"


def app_args(config: Path) -> dict:
    return yaml.safe_load(config.read_text())["applications"][0]["args"]


@pytest.mark.parametrize("name", ["local.yaml", "inf2.yaml"])
def test_the_readme_configs_are_valid_serve_configs(name):
    from serve_app.config import AppArgs

    config = ROOT / "configs" / name
    assert f"configs/{name}" in README.read_text()
    args = AppArgs(**app_args(config))
    assert args.models
    assert yaml.safe_load(config.read_text())["applications"][0]["import_path"] == "serve_app.app:build_app"
