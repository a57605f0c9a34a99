"""Prefix-aware routing across the replicas of one model: Ray Serve's request-router API (`RequestRouter`, the
mechanism Ray Serve LLM's `PrefixCacheAffinityRouter` uses), so the turns of a conversation, and the requests
that share a system prompt, go to the replica whose engine kept their prefix's KV.

Each request's key is its text as the replica will see it before rendering: the messages (with the tools and
template switches) as canonical JSON, or the completion prompt. Its prefixes are hashed in blocks of
`BLOCK` characters (a chain: block k's hash covers blocks 0..k), and every replica remembers the block hashes
of the requests routed to it (least recently used first out, `keep` of them). A request goes to the replica
with the longest remembered prefix of at least `min_chars` characters, unless that replica's queue is more than
`imbalance` requests longer than the shortest one; otherwise (no match, or too busy) the power-of-two choice as
Serve's default router makes it. The table lives in the router process (one per ingress replica): with several
ingress replicas each keeps its own, which still sends most turns home. The engine's prefix counters, tagged
by replica (`ray_gemma4_prefix_cache_hit_tokens`), show the hits; `ray_gemma4_prefix_routed_total` counts the
requests routed by a match.
"""

from __future__ import annotations

import json
import random
from collections import OrderedDict

from ray.serve.request_router import FIFOMixin, LocalityMixin, PendingRequest, ReplicaID, RequestRouter, RunningReplica

BLOCK = 128  # characters a prefix block holds


def request_key(request) -> str | None:
    """The text a request's prefix is matched on (None: not a generation request)."""
    kind = getattr(request, "kind", None)
    if kind == "chat":
        head = json.dumps([list(request.tools), list(request.template_kwargs)], sort_keys=True, default=str)
        return head + json.dumps(list(request.messages), sort_keys=True, default=str)
    if kind == "completion":
        p = request.prompt
        return p if isinstance(p, str) else " ".join(map(str, p or ()))
    return None


def block_hashes(key: str) -> list[int]:
    """The chained hashes of the key's whole blocks (and of its tail)."""
    out, h = [], 0
    for i in range(0, len(key), BLOCK):
        h = hash((h, key[i:i + BLOCK]))
        out.append(h)
    return out


class PrefixTable:
    """Which block hashes each replica has seen, most recently used last."""

    def __init__(self, keep: int):
        self.keep = keep
        self.seen: dict[str, OrderedDict[int, None]] = {}

    def match(self, replica: str, hashes: list[int]) -> int:
        """Blocks of the key that `replica` has seen, from the start."""
        seen = self.seen.get(replica)
        if not seen:
            return 0
        lo, hi = 0, len(hashes)  # a chain: block k seen means every block before it was (binary search)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if hashes[mid - 1] in seen:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def add(self, replica: str, hashes: list[int]) -> None:
        """Remember a key's blocks, its first block the most recent: a block always leaves before the blocks
        in front of it, so what is kept stays a chain from the start (`match` relies on it)."""
        seen = self.seen.setdefault(replica, OrderedDict())
        for h in reversed(hashes):
            seen[h] = None
            seen.move_to_end(h)
        while len(seen) > self.keep:
            seen.popitem(last=False)

    def forget(self, keep_only: set[str]) -> None:
        for r in list(self.seen):
            if r not in keep_only:
                del self.seen[r]


class PrefixAffinityRouter(FIFOMixin, LocalityMixin, RequestRouter):
    def initialize_state(self, imbalance: int = 4, min_chars: int = 256, keep: int = 65536, model: str = ""):
        self.imbalance, self.min_blocks = imbalance, max(1, min_chars // BLOCK)
        self.table = PrefixTable(keep)
        self.model = model
        self._counter = None

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        hashes = self._hashes(pending_request)
        if hashes and len(candidate_replicas) > 1:
            best = self._affine(candidate_replicas, hashes)
            if best is not None:
                self._count()
                return [[best]]
        return [random.sample(candidate_replicas, min(2, len(candidate_replicas)))]

    def _affine(self, replicas: list[RunningReplica], hashes: list[int]) -> RunningReplica | None:
        """The replica holding the longest prefix (most recently seen first on a tie), unless it is too busy."""
        scored = [(self.table.match(r.replica_id.to_full_id_str(), hashes), r) for r in replicas]
        blocks, best = max(scored, key=lambda s: s[0])
        if blocks < self.min_blocks:
            return None
        queue = self.replica_queue_len_cache
        lens = [queue.get(r.replica_id) or 0 for r in replicas]
        return best if (queue.get(best.replica_id) or 0) - min(lens) <= self.imbalance else None

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result) -> None:
        hashes = self._hashes(pending_request)
        if hashes:
            self.table.add(replica_id.to_full_id_str(), hashes)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        self.table.forget({r.replica_id.to_full_id_str() for r in replicas})

    @staticmethod
    def _hashes(pending_request: PendingRequest | None) -> list[int]:
        args = pending_request.args if pending_request is not None else ()
        key = next((k for k in map(request_key, args or ()) if k), None)
        return block_hashes(key) if key else []

    def _count(self) -> None:
        """ray_gemma4_prefix_routed_total{model}: requests sent to a replica by a prefix match."""
        if self._counter is None:
            from ray.util import metrics

            self._counter = metrics.Counter("gemma4_prefix_routed", "Requests routed to the replica holding their "
                                            "longest prefix", tag_keys=("model",))
        self._counter.inc(1, tags={"model": self.model})
