"""Prefix-aware routing's table and keys (no cluster): a conversation's next turn and a shared system prompt
match the replica that saw them, a different first message matches nothing, the binary search over the block
chain agrees with a linear scan, least recently used blocks leave a full table, and the request router picks the
matching replica unless its queue is too long (the cluster test is tests/serve/test_prefix_routing.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from serve_app.events import GenerateRequest
from serve_app.ops.prefix_router import BLOCK, PrefixAffinityRouter, PrefixTable, block_hashes, request_key

SYSTEM = {"role": "system", "content": "You are a careful assistant. " * 40}


def chat(*messages) -> GenerateRequest:
    return GenerateRequest(kind="chat", messages=tuple(messages))


def test_keys_and_matches():
    t1 = chat(SYSTEM, {"role": "user", "content": "What is a prime?"})
    t2 = chat(*t1.messages, {"role": "assistant", "content": "A number..."}, {"role": "user", "content": "More"})
    other = chat({"role": "system", "content": "Different. " * 100}, {"role": "user", "content": "hi"})
    table = PrefixTable(keep=10_000)
    table.add("a", block_hashes(request_key(t1)))
    k1, k2 = request_key(t1), request_key(t2)
    assert k2.startswith(k1[:-1])  # the next turn extends the last one's key (less its closing bracket)
    assert table.match("a", block_hashes(k2)) == (len(k1) - 1) // BLOCK
    assert table.match("a", block_hashes(request_key(other))) == 0 and table.match("b", block_hashes(k2)) == 0
    q2 = chat(SYSTEM, {"role": "user", "content": "Another question"})
    assert table.match("a", block_hashes(request_key(q2))) >= len(SYSTEM["content"]) // BLOCK
    assert request_key(GenerateRequest(kind="completion", prompt=(1, 2, 3))) == "1 2 3"
    assert request_key("not a request") is None


def test_binary_search_equals_a_scan_and_lru():
    table = PrefixTable(keep=6)
    hashes = block_hashes("x" * (BLOCK * 10))
    table.add("a", hashes[:4])
    assert table.match("a", hashes) == 4 == sum(h in table.seen["a"] for h in hashes)
    table.add("a", block_hashes("y" * (BLOCK * 3)))  # 7 blocks > 6: the deepest x block leaves first
    assert len(table.seen["a"]) == 6 and table.match("a", hashes) == 3
    table.forget({"b"})
    assert "a" not in table.seen


def fake_replica(name: str):
    return SimpleNamespace(replica_id=SimpleNamespace(to_full_id_str=lambda: name, name=name))


class Policy(PrefixAffinityRouter):
    """The routing policy alone, without Serve's machinery: queue lengths from a dict."""

    queues: dict[str, int] = {}

    @property
    def replica_queue_len_cache(self):
        return SimpleNamespace(get=lambda rid: self.queues[rid.name])


def test_router_prefers_the_match_unless_busy():
    router = Policy.__new__(Policy)
    router.initialize_state(imbalance=2, min_chars=256)
    a, b = fake_replica("a"), fake_replica("b")
    queues = router.queues = {"a": 0, "b": 0}
    req = SimpleNamespace(args=(chat(SYSTEM, {"role": "user", "content": "q1"}),))
    router.on_request_routed(req, a.replica_id, None)
    nxt = SimpleNamespace(args=(chat(SYSTEM, {"role": "user", "content": "q2"}),))
    choose = lambda: asyncio.run(router.choose_replicas([b, a], nxt))
    assert choose() == [[a]]
    queues["a"] = 3  # 3 more than b: past the imbalance allowed
    assert len(choose()[0]) == 2  # the power-of-two fallback
    short = SimpleNamespace(args=(chat({"role": "user", "content": "hi"}),))  # shorter than min_chars
    queues["a"] = 0
    assert len(asyncio.run(router.choose_replicas([b, a], short))[0]) == 2
