"""Speculative decoding with an MTP drafter (`draft_model`, a `gemma4_assistant` checkpoint; tiny, fp32).

The draft graph equals transformers' own `Gemma4AssistantForCausalLM` (its kv_sharing_modes patched, as
`testing.tiny_assistant` says) on the same target K/V, past the sliding window, with the centroid-masked head,
on all three structures; every round of drafts the engine makes equals the drafts transformers' assistant
makes from transformers' own target (its last hidden state and stored K/V); greedy tokens equal transformers'
with a random drafter (drafts mostly rejected) and with a drafter that copies a looping target (every draft
accepted), batched with a row that decodes beside; the hidden state a row keeps after any number of accepted
drafts is transformers'; the same at TP=2; transformers' `generate(assistant_model=...)` with the same drafter
gives the same tokens (and where its rounds read other K/V, the test says which); the loader refuses what does
not fit, naming draft_model. The 12B's own drafter kind, `gemma4_unified_assistant` (transformers'
`Gemma4UnifiedAssistantForCausalLM` over a `gemma4_unified_text` stack), drafts for the 12B-like target as
transformers' does, its greedy tokens through `python -m neuron_workers.generate` are those without a drafter, and
it is refused for an E-model target.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from neuron_workers.config import EngineConfig
from neuron_workers.engine.params import SamplingParams
from neuron_workers.errors import UserError
from neuron_workers.factory import build_engine
from neuron_workers.model.assistant import check_pairing, load_assistant, read_assistant_info, store_layers
from neuron_workers.model.draft_graph import DraftGraph, draft_masks
from neuron_workers.model.loader import load_model
from neuron_workers.testing.tiny_assistant import (
    all_layers_share_kv,
    reference_assistant,
    write_copying_assistant,
    write_tiny_assistant,
    write_tiny_unified_assistant,
)

from conftest import NAMES, hf_greedy, hf_reference

CTX = 96
A = [2] + [(5 * i) % 60 + 7 for i in range(21)]
C = [2, 40, 41, 42, 43]
UNIFIED = "gemma4-12b-tiny/unified"  # the 12B-like target with a gemma4_unified_assistant drafter


def target_of(name: str) -> str:
    return name.split("/")[0]


@pytest.fixture(scope="module")
def drafters(tiny_dirs, tmp_path_factory):
    out = tmp_path_factory.mktemp("assistants")
    made = {name: write_tiny_assistant(tiny_dirs[name], out / name, seed=1) for name in NAMES}
    made[UNIFIED] = write_tiny_unified_assistant(tiny_dirs[target_of(UNIFIED)], out / "unified", seed=1)
    return made


def engine(path, draft, k, **kw):
    return build_engine(EngineConfig(model=str(path), max_context=CTX, prefill_buckets=(32, 96), max_batch=3,
                                     draft_model=str(draft), num_speculative_tokens=k, **kw))


def run(eng, jobs):
    seqs = [eng.new_sequence(p, SamplingParams(max_tokens=n, ignore_eos=True), logprobs=lp) for p, n, lp in jobs]
    for ev in eng.run_all(seqs):
        assert not hasattr(ev, "message"), ev
    return [s.output_ids for s in seqs]


@pytest.mark.parametrize("name", NAMES + (UNIFIED,))
def test_draft_graph_equals_transformers_assistant(name, tiny_dirs, drafters):
    target = load_model(tiny_dirs[target_of(name)])
    ours, ref = load_assistant(drafters[name]), reference_assistant(drafters[name])
    assert type(ref).__name__ == ("Gemma4UnifiedAssistantForCausalLM" if name == UNIFIED else
                                  "Gemma4AssistantForCausalLM")
    assert type(ours.model) is type(ref.model)  # Gemma4UnifiedTextModel for the unified kind
    dims, window = target.dims, ours.model.config.sliding_window
    assert ours.masked_embedding is not None  # the centroid-masked head of the real E2B / E4B assistants
    sto, b, ring = store_layers(dims), 3, dims.ring_size(CTX)
    gen = torch.Generator().manual_seed(0)
    full = [torch.randn(dims.kv_shape(sto["full_attention"], b, CTX), generator=gen) for _ in "kv"]
    heads, hd = dims.kv_shape(sto["sliding_attention"], b, CTX)[1::2]
    true = [torch.randn(b, heads, CTX, hd, generator=gen) for _ in "kv"]  # sliding K/V of every position
    q = torch.tensor([4, window + 1, 3 * window + 5])  # inside, at and well past the window (W + 1 keys)
    ring_kv = [torch.zeros(b, heads, ring, hd) for _ in "kv"]
    for row, n in enumerate(q.tolist()):
        for p in range(n):
            for r, t in zip(ring_kv, true):
                r[row, :, p % ring] = t[row, :, p]
    ids = torch.randint(0, dims.vocab_size, (b, 1), generator=gen)
    hidden = torch.randn(b, 1, dims.hidden_size, generator=gen)
    masks = draft_masks(q, CTX, ring, window, torch.float32)
    with torch.no_grad():
        drafts, nxt = DraftGraph(ours, target.hf_lm.model.embed_tokens)(ids, hidden, q[:, None], *masks, *full,
                                                                          *ring_kv)
        for row, n in enumerate(q.tolist()):
            emb = target.hf_lm.model.embed_tokens(ids[row:row + 1])
            kv = {"full_attention": tuple(x[row:row + 1, :, :n] for x in full),
                  "sliding_attention": tuple(x[row:row + 1, :, :n] for x in true)}
            out = ref(inputs_embeds=torch.cat([emb, hidden[row:row + 1]], -1), position_ids=torch.tensor([[n]]),
                      attention_mask=torch.ones(1, n + 1, dtype=torch.long), shared_kv_states=kv)
            assert int(drafts[row]) == int(out.logits[0, -1].argmax()), (name, n)
            torch.testing.assert_close(nxt[row], out.last_hidden_state[0], rtol=1e-5, atol=1e-5)


def storing(target, dims):
    """transformers' target with its last sliding and last full KV layer returning their K/V (the E-models mark
    them "store" themselves; the 12B, which shares no KV, marks none, so no transformers target hands its K/V
    to an assistant: set here, on the layers that `assistant.store_layers` names)."""
    for j in store_layers(dims).values():
        target.model.language_model.layers[j].self_attn.store_full_length_kv = True
    return target


def reference_drafts(target, assistant, tokens: list[int], k: int, rejected: int | None = None) -> list[int]:
    """transformers: the target over tokens[:-1] gives its last hidden state and stored K/V; the assistant drafts
    k tokens from tokens[-1] at that position (as transformers' SinglePositionMultiTokenCandidateGenerator, with
    exactly the K/V of the positions before it). `rejected`: the K/V also holds, at the draft's own position, the
    K/V of that token (what transformers' generator reads after a verify that rejected it)."""
    q = len(tokens) - 1
    with torch.no_grad():
        out = target(torch.tensor([tokens[:-1] + ([] if rejected is None else [rejected])]),
                     return_shared_kv_states=True, output_hidden_states=True, use_cache=False)
        hidden, kv = out.hidden_states[-1][:, q - 1:q], dict(out.shared_kv_states)
        tok, drafts = torch.tensor([[tokens[-1]]]), []
        for _ in range(k):
            a = assistant(inputs_embeds=torch.cat([target.get_input_embeddings()(tok), hidden], -1),
                          position_ids=torch.tensor([[q]]), attention_mask=torch.ones(1, q + 1, dtype=torch.long),
                          shared_kv_states=kv)
            tok, hidden = a.logits[:, -1:].argmax(-1), a.last_hidden_state
            drafts.append(int(tok))
    return drafts


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES + (UNIFIED,))
def test_engine_drafts_and_greedy_tokens_equal_transformers(name, tiny_dirs, drafters):
    """Every third round takes oracle drafts right for 0..k tokens in turn (so verifies keep any number of
    drafts), the others the engine's MTP drafts (checked against transformers' assistant); every row ready to
    draft holds transformers' last hidden state for the position before its next token."""
    eng = engine(tiny_dirs[target_of(name)], drafters[name], 3)
    target = storing(hf_reference(tiny_dirs[target_of(name)]), eng.dims)
    assistant = reference_assistant(drafters[name])
    want = {tuple(A): hf_greedy(target, A, 30), tuple(C): hf_greedy(target, C, 20)}
    rounds, held, calls, propose = [], [], [], eng.drafter.propose_all

    def oracle(s, room, i):
        ref = want[tuple(s.prompt_ids)][len(s.output_ids):][:room]
        return ref[:i % (room + 1)] + [(t + 1) % eng.dims.vocab_size for t in ref[i % (room + 1):]]

    def drafts(seqs, rooms):
        held.extend((s.prompt_ids + s.output_ids, s.hidden) for s in seqs if eng.drafter.ready(s))
        calls.append(len(calls))
        if len(calls) % 3 == 0:
            return {s.seq_id: oracle(s, rooms[s.seq_id], len(calls) // 3) for s in seqs}
        got = propose(seqs, rooms)
        rounds.extend((s.prompt_ids + s.output_ids, got[s.seq_id]) for s in seqs if got[s.seq_id])
        return got

    eng.drafter.propose_all = drafts
    got = run(eng, [(A, 30, None), (C, 20, 2)])  # C asks logprobs: it decodes beside, never drafts
    assert got == [want[tuple(A)], want[tuple(C)]]
    assert len(rounds) >= 3 and eng.spec_accepted_tokens > 2
    assert {tuple(t[:len(C)]) for t, _ in rounds + held} == {tuple(A[:len(C)])}
    with torch.no_grad():
        for tokens, drafted in rounds:
            assert drafted == reference_drafts(target, assistant, tokens, len(drafted)), (name, len(tokens))
        for tokens, hidden in held[::2]:
            h = target(torch.tensor([tokens[:-1]]), output_hidden_states=True, use_cache=False).hidden_states[-1]
            torch.testing.assert_close(hidden, h[0, -1], rtol=1e-3, atol=1e-3)  # another one's is O(1) away


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_chunks_beside_drafting_rows_run_the_mixed_graph_and_drafting_resumes(name, tiny_dirs, drafters):
    """A prompt chunked by 6 beside a row that drafts: each of its chunk steps beside that row is one
    `mixed_3x6_h` graph (the row decodes one token, nothing verifies), which returns the hidden states the next
    round reads, so the first step after the last chunk drafts for both rows with no plain decode step first (a
    prompt chunked alone too: `extend_1x6_h`); every hidden state a ready row holds is transformers', every round
    of drafts is transformers' assistant's, and the greedy tokens are transformers'."""
    eng = engine(tiny_dirs[name], drafters[name], 3, prefill_chunk=6)
    assert eng.mixed_steps
    target, assistant = storing(hf_reference(tiny_dirs[name]), eng.dims), reference_assistant(drafters[name])
    log, rounds, held, propose, extend = [], [], [], eng.drafter.propose_all, eng.backend.extend

    def drafts(seqs, rooms):
        ready = [s for s in seqs if eng.drafter.ready(s)]
        log.append(("draft", sorted(len(s.prompt_ids) for s in ready)))
        held.extend((s.prompt_ids + s.output_ids, s.hidden) for s in ready)
        got = propose(seqs, rooms)
        rounds.extend((s.prompt_ids + s.output_ids, got[s.seq_id]) for s in seqs if got[s.seq_id])
        return got

    def graph(spec, inputs):
        log.append(("graph", spec.tag))
        return extend(spec, inputs)

    eng.drafter.propose_all, eng.backend.extend = drafts, graph
    assert run(eng, [(C, 20, None), (A, 30, None)]) == [hf_greedy(target, C, 20), hf_greedy(target, A, 30)]
    mixed = [i for i, e in enumerate(log) if e == ("graph", "mixed_3x6_h")]
    assert len(mixed) >= 3 and not any(e[0] == "draft" for e in log[mixed[0]:mixed[-1]]), log  # no verify between
    after = next(e for e in log[mixed[-1] + 1:] if e[0] == "draft")
    assert after == ("draft", [len(C), len(A)]), log  # both ready: no plain decode step after the chunks
    assert len(rounds) >= 3 and len(held) >= 4
    check_rounds(target, assistant, rounds, held)
    log.clear(), rounds.clear(), held.clear()
    solo = [2] + [(7 * i) % 60 + 3 for i in range(17)]  # chunked alone: its last chunk is `extend_1x6_h`
    assert run(eng, [(solo, 6, None)]) == [hf_greedy(target, solo, 6)]
    assert ("graph", "extend_1x6_h") in log and next(e for e in log if e[0] == "draft") == ("draft", [len(solo)])
    check_rounds(target, assistant, rounds, held)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gemma4-e2b-tiny", "gemma4-12b-tiny"])
def test_a_row_beside_a_logprobs_row_starts_drafting(name, tiny_dirs, drafters):
    """Beside a row that asks logprobs every decode step needs the full logits, whose graph returns no hidden
    state: the step first runs the top-K `_h` decode graph for the row fresh from its prefill, so that row drafts
    from the step after (its first round after two tokens; without it, never); its rounds and the hidden states it
    held are transformers', and both rows' tokens too."""
    eng = engine(tiny_dirs[name], drafters[name], 3)
    target, assistant = storing(hf_reference(tiny_dirs[name]), eng.dims), reference_assistant(drafters[name])
    rounds, held, propose = [], [], eng.drafter.propose_all

    def drafts(seqs, rooms):
        held.extend((s.prompt_ids + s.output_ids, s.hidden) for s in seqs if eng.drafter.ready(s))
        got = propose(seqs, rooms)
        rounds.extend((s.prompt_ids + s.output_ids, got[s.seq_id]) for s in seqs if got[s.seq_id])
        return got

    eng.drafter.propose_all = drafts
    assert run(eng, [(A, 30, None), (C, 20, 2)]) == [hf_greedy(target, A, 30), hf_greedy(target, C, 20)]
    assert rounds and len(rounds[0][0]) == len(A) + 2, [len(t) for t, _ in rounds]
    assert {tuple(t[:len(A)]) for t, _ in rounds} == {tuple(A)}  # the logprobs row never drafts
    check_rounds(target, assistant, rounds, held)


def check_rounds(target, assistant, rounds, held) -> None:
    """Every round of drafts is transformers' assistant's; every hidden state a ready row held is transformers'."""
    assert rounds and held
    with torch.no_grad():
        for tokens, drafted in rounds:
            assert drafted == reference_drafts(target, assistant, tokens, len(drafted)), len(tokens)
        for tokens, hidden in held:
            h = target(torch.tensor([tokens[:-1]]), output_hidden_states=True, use_cache=False).hidden_states[-1]
            torch.testing.assert_close(hidden, h[0, -1], rtol=1e-3, atol=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_transformers_assisted_generate_with_the_same_drafter(name, tiny_dirs, drafters):
    """transformers' `generate(assistant_model=...)` with the same drafter (3 drafts a round): its greedy tokens
    equal the engine's with that drafter, past the window. Its rounds (its candidate generator recorded), inside
    the window: after the prefill or a round that kept every draft, the assistant's drafts over the K/V of the
    positions before the draft (`reference_drafts`, what the engine's rounds equal above); after a rejection its
    K/V slice also holds the K/V the verify wrote at the draft's own position for the rejected draft, and its
    drafts are the assistant's over exactly that. The engine reads only the positions before the draft, as
    transformers' first round does (mlx-swift-lm#308 fixed the same read of rejected rows). Past the window its
    rounds are not compared: its sliding cache keeps the last entries only, and slicing them by length hands the
    assistant positions past the draft's too."""
    from transformers.generation import candidate_generator as cg

    eng = engine(tiny_dirs[name], drafters[name], 3)
    target, assistant = storing(hf_reference(tiny_dirs[name]), eng.dims), reference_assistant(drafters[name])
    assistant.generation_config.num_assistant_tokens = 3
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    generator, rounds = cg.SinglePositionMultiTokenCandidateGenerator, []
    original = generator.get_candidates

    def recorded(self, input_ids, *args, **kwargs):
        out = original(self, input_ids, *args, **kwargs)
        if out[0].shape[1] > input_ids.shape[1]:
            rounds.append((input_ids[0].tolist(), out[0][0, input_ids.shape[1]:].tolist()))
        return out

    def assisted(prompt, n):
        with all_layers_share_kv():
            out = target.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n, min_new_tokens=n,
                                  pad_token_id=0, assistant_model=assistant)
        return out[0, len(prompt):].tolist()

    generator.get_candidates = recorded
    try:
        assert assisted(A, 30) == run(eng, [(A, 30, None)])[0] == hf_greedy(target, A, 30)
        rounds.clear()
        short = [2, 40, 41]  # + 5 tokens: inside the tiny window of 8
        assert assisted(short, 5) == hf_greedy(target, short, 5)
    finally:
        generator.get_candidates = original
    kept_all = [True] + [len(t) - len(pt) - 1 == len(pd) for (pt, pd), (t, _) in zip(rounds, rounds[1:])]
    assert len(rounds) >= 3 and not all(kept_all)  # random drafts: rounds after a rejection
    for (tokens, drafted), clean, before in zip(rounds, kept_all, [None] + rounds[:-1]):
        rejected = None if clean else before[1][len(tokens) - len(before[0]) - 1]
        assert drafted == reference_drafts(target, assistant, tokens, len(drafted), rejected), (len(tokens), clean)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gemma4-12b-tiny"])  # split and replicated K/V (E4B-like: split only)
def test_drafts_at_tp2(name, tiny_dirs, drafters):
    """TP=2: the drafter's query heads split as the K/V they read (12B-like: sliding K/V split, the full layer's
    one KV head replicated; E4B-like: both split); a prompt chunked by 6 beside a decoding row runs `mixed_3x6_h`;
    every round of drafts and the tokens as transformers'."""
    eng = engine(tiny_dirs[name], drafters[name], 2, tp=2, prefill_chunk=6)
    try:
        assert eng.mixed_steps
        rounds, tags, propose, extend = [], [], eng.drafter.propose_all, eng.backend.extend

        def drafts(seqs, rooms):
            got = propose(seqs, rooms)
            rounds.extend((s.prompt_ids + s.output_ids, got[s.seq_id]) for s in seqs if got[s.seq_id])
            return got

        def graph(spec, inputs):
            tags.append(spec.tag)
            return extend(spec, inputs)

        eng.drafter.propose_all, eng.backend.extend = drafts, graph
        target, assistant = storing(hf_reference(tiny_dirs[name]), eng.dims), reference_assistant(drafters[name])
        assert run(eng, [(C, 16, None), (A, 24, None)]) == [hf_greedy(target, C, 16), hf_greedy(target, A, 24)]
        assert len(rounds) >= 10 and "mixed_3x6_h" in tags, tags  # A's chunks beside C's decoding row
        for tokens, drafted in rounds:  # the rounds after the mixed steps read the hidden states they returned
            assert drafted == reference_drafts(target, assistant, tokens, len(drafted)), len(tokens)
    finally:
        eng.close()


@pytest.mark.slow
def test_every_draft_accepted_from_a_copying_drafter(tiny_dirs, tmp_path):
    from safetensors.torch import load_file, save_file

    looping = tmp_path / "looping"  # the 12B-like target with no attention / MLP output: next token = f(token)
    shutil.copytree(tiny_dirs["gemma4-12b-tiny"], looping)
    w = load_file(str(looping / "model.safetensors"))
    save_file({k: v * 0 if k.endswith(("o_proj.weight", "down_proj.weight")) else v for k, v in w.items()},
              str(looping / "model.safetensors"))
    draft = write_copying_assistant(looping, tmp_path / "copy")
    want = hf_greedy(hf_reference(looping), A, 40)
    for k in (1, 4):
        eng = engine(looping, draft, k)
        assert run(eng, [(A, 40, None), (C, 12, None)])[0] == want
        assert eng.spec_accepted_tokens == eng.spec_draft_tokens > 0, k
        assert eng.drafter.steps <= k * (40 // (k + 1) + 2), k  # k draft steps a round, k + 1 tokens a round


def test_unified_drafter_through_generate_gives_the_tokens_of_no_drafter(tiny_dirs, drafters, capsys):
    """`python -m neuron_workers.generate` on the 12B-like target: the same greedy tokens with its
    gemma4_unified_assistant drafter (which drafts: its rounds run) as without one, past the window."""
    from neuron_workers import generate
    from neuron_workers.engine.mtp import MtpDrafter

    steps, original = [], MtpDrafter.propose_all

    def counted(self, seqs, rooms):
        got = original(self, seqs, rooms)
        steps.append(sum(len(d) for d in got.values()))
        return got

    def tokens(*extra):
        argv = ["--model", str(tiny_dirs[target_of(UNIFIED)]), "--prompt-ids", ",".join(map(str, A)),
                "--max-tokens", "24", "--ignore-eos", "--json", "--max-context", str(CTX), *extra]
        assert generate.main(argv) == 0
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])["token_ids"]

    MtpDrafter.propose_all = counted
    try:
        plain = tokens()
        drafted = tokens("--draft-model", str(drafters[UNIFIED]), "--num-speculative-tokens", "3")
    finally:
        MtpDrafter.propose_all = original
    assert len(plain) == 24 and drafted == plain
    assert sum(steps) > 0  # the drafter ran
    assert plain == hf_greedy(hf_reference(tiny_dirs[target_of(UNIFIED)]), A, 24)


def test_a_unified_drafter_is_refused_for_an_e_model_target(tiny_dirs, drafters):
    from neuron_workers.model.assistant import UNIFIED_ASSISTANT_TYPE

    info = read_assistant_info(drafters[UNIFIED])
    assert info.model_type == UNIFIED_ASSISTANT_TYPE and info.text_config.model_type == "gemma4_unified_text"
    e4b = load_model(tiny_dirs["gemma4-e4b-tiny"], with_weights=False)
    with pytest.raises(UserError, match="gemma4_unified targets, not a gemma4 one") as e:
        check_pairing(info, e4b.dims, e4b.info.model_type)
    assert e.value.param == "draft_model"
    with pytest.raises(UserError, match="gemma4_unified targets") as e:
        engine(tiny_dirs["gemma4-e4b-tiny"], drafters[UNIFIED], 2)
    assert e.value.param == "draft_model"
    twelve = load_model(tiny_dirs[target_of(UNIFIED)], with_weights=False)
    check_pairing(info, twelve.dims, twelve.info.model_type)  # its own target: fits
    check_pairing(read_assistant_info(drafters[target_of(UNIFIED)]), twelve.dims, twelve.info.model_type)


def test_a_drafter_that_does_not_fit_is_refused(tiny_dirs, drafters, tmp_path):
    e2b, e4b = load_model(tiny_dirs["gemma4-e2b-tiny"], with_weights=False), drafters["gemma4-e4b-tiny"]
    with pytest.raises(UserError, match="KV heads") as e:
        check_pairing(read_assistant_info(e4b), e2b.dims)  # E4B's 2 KV heads against E2B's 1
    assert e.value.param == "draft_model"
    with pytest.raises(UserError, match="gemma4_assistant' or 'gemma4_unified_assistant"):
        read_assistant_info(tiny_dirs["gemma4-e4b-tiny"])  # a target is not a drafter
    broken = shutil.copytree(e4b, tmp_path / "broken")
    from safetensors.torch import load_file, save_file

    w = load_file(str(broken / "model.safetensors"))
    del w["pre_projection.weight"]
    save_file(w, str(broken / "model.safetensors"))
    with pytest.raises(UserError, match="1 missing"):
        load_assistant(broken)
    cfg = json.loads((e4b / "config.json").read_text())
    with pytest.raises(UserError, match="two drafters"):
        EngineConfig(model="m", draft_model=str(e4b), speculative_method="ngram")
    assert cfg["model_type"] == "gemma4_assistant"
    # artifacts built without this drafter: tests/compile/test_manifest.py (check_drafter) and test_compile.py
