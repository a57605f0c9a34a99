"""The artifact manifest: every field that shapes a compiled graph, plus the library versions it was
built with. `compile build` writes it; serving (runtime work, so it lives here) refuses artifacts whose
manifest does not match its checkpoint config, its settings or the installed versions, naming the field.

Extend graphs (`extend_graphs`, [rows, t, variant] each, `backends.neuron.ExtendShape`) and the chunk sizes
chunked prefill may use with them (`extend_buckets`) came after format 3 without changing it: a manifest
written before them reads as one with none (chunked prefill stays off), and a `prefill_chunk` asked for must be
among them (`serving_chunk`). A build with an MTP drafter (`compile build --draft-model`) records it in `drafter`
(`drafter_facts`: its directory name and the config facts that shape the draft graph) and has `decode_h` (the
top-K decode that also returns the hidden state) in place of `decode`, and `draft`; a manifest written before
drafters reads as one without."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

from neuron_workers.errors import UserError

MANIFEST = "manifest.json"
FORMAT = 3  # 3: `decode` is the top-K candidates graph, `decode_logits` the full-logits one
VERSIONED = {"cpu": ("torch", "transformers"),
             "neuron": ("torch", "transformers", "torch-neuronx", "neuronx-cc", "neuronx-distributed",
                        "libneuronxla", "torch-xla")}


def config_hash(text_config) -> str:
    """sha256 of the text config as HF serialises it (sorted keys), the model's shape identity."""
    d = text_config.to_dict()
    for k in ("transformers_version", "_name_or_path", "_attn_implementation_autoset", "dtype", "torch_dtype"):
        d.pop(k, None)
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def installed_versions(backend: str) -> dict[str, str | None]:
    out = {}
    for pkg in VERSIONED[backend]:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


@dataclass
class Manifest:
    backend: str
    config_hash: str
    model_type: str
    tp: int
    max_batch: int
    max_context: int
    prefill_buckets: list[int]
    dtype: str
    compiler_flags: dict[str, str]
    versions: dict[str, str | None]
    graphs: dict[str, str] = field(default_factory=dict)  # tag -> file, relative to the artifact dir
    format: int = FORMAT
    extend_graphs: list[list] = field(default_factory=list)  # [rows, t, variant] of every extend graph built
    extend_buckets: list[int] = field(default_factory=list)  # T of the chunked-prefill graphs (extend_1xT, _logits)
    drafter: dict = field(default_factory=dict)  # the MTP drafter built in (`drafter_facts`); {}: none
    prefix_windows: int = 0  # kept sliding windows the build's pool holds (the window graphs; 0: none built)
    media_ids: list[int] = field(default_factory=list)  # soft-token ids whose embeddings the prefill / extend
    # graphs take as `mm_embeds` (a build of a checkpoint that serves images / audio); []: text only

    def write(self, out_dir: Path) -> Path:
        path = Path(out_dir) / MANIFEST
        path.write_text(json.dumps(asdict(self), indent=1))
        return path

    @classmethod
    def read(cls, art_dir: str | Path) -> "Manifest":
        path = Path(art_dir) / MANIFEST
        if not path.is_file():
            raise UserError(f"no {MANIFEST} in {art_dir}: build artifacts with `python -m compile build`")
        try:
            return cls(**json.loads(path.read_text()))
        except (TypeError, json.JSONDecodeError) as e:
            raise UserError(f"{path} is not a manifest this version can read: {e}") from None

    def check(self, text_config, versions: dict | None = None, **expected) -> None:
        """Raise a UserError naming the first field that disagrees with the checkpoint or this install."""
        if self.format != FORMAT:
            raise UserError(f"artifact format {self.format}, this version reads {FORMAT}: rebuild")
        have = config_hash(text_config)
        if self.config_hash != have:
            raise UserError(f"artifacts were built for another model config (hash {self.config_hash}, "
                            f"checkpoint has {have}): rebuild them for this checkpoint")
        for name, want in expected.items():
            if want is not None and getattr(self, name) != want:
                raise UserError(f"artifacts were built with {name}={getattr(self, name)!r}, "
                                f"this request asks for {want!r}: rebuild or change {name}")
        versions = versions if versions is not None else installed_versions(self.backend)
        for pkg, built in self.versions.items():
            if versions.get(pkg) != built:
                raise UserError(f"artifacts were built with {pkg} {built}, installed is {versions.get(pkg)}: "
                                f"rebuild them or install {pkg}=={built}")
        want = {f"prefill_{b}" for b in self.prefill_buckets} | {"decode_logits"}
        want |= {"decode_h", "draft"} if self.drafter else {"decode"}
        if want - set(self.graphs):
            raise UserError(f"artifacts lack the graphs {sorted(want - set(self.graphs))}: rebuild them")


def drafter_facts(info) -> dict:
    """What a build records of its MTP drafter (`model.assistant.AssistantInfo`): the checkpoint directory's name
    (for people) and every config fact the draft graph's shapes and weights depend on (for the check at load)."""
    return {"name": Path(info.model_dir).name, "config_hash": config_hash(info.text_config),
            "backbone_hidden_size": info.backbone_hidden_size, "use_ordered_embeddings": info.use_ordered_embeddings,
            "num_centroids": info.num_centroids, "centroid_top_k": info.centroid_top_k}


def check_drafter(manifest: Manifest, info) -> None:
    """Serving `draft_model` (its `AssistantInfo`) needs artifacts built with that very drafter: a UserError naming
    draft_model otherwise."""
    if not manifest.drafter:
        raise UserError(f"the artifacts were built without an MTP drafter (no draft graph): rebuild them with "
                        f"`compile build --draft-model {info.model_dir}` or leave draft_model unset",
                        param="draft_model")
    have = drafter_facts(info)
    off = [k for k in have if k != "name" and manifest.drafter.get(k) != have[k]]
    if off:
        raise UserError(f"the artifacts' draft graph was built for another drafter ({manifest.drafter.get('name')}: "
                        f"{off[0]} {manifest.drafter.get(off[0])!r}, {info.model_dir} has {have[off[0]]!r}): rebuild "
                        f"with `compile build --draft-model {info.model_dir}`", param="draft_model")


def serving_chunk(manifest: Manifest, prefill_chunk: int | None, ring: int) -> tuple[int, ...]:
    """The T of the extend graphs an engine served from `manifest` may run (`Backend.extend_buckets`): the built
    ones. A `prefill_chunk` asked for (clamped to the ring and the context, as `config.resolve_prefill_chunk`
    clamps it) must be one of them: a UserError naming the field otherwise. 0 (chunking off) keeps them: the
    engine decides what it uses them for."""
    built = tuple(manifest.extend_buckets)
    want = min(prefill_chunk or 0, ring, manifest.max_context)
    if want and want not in built:
        raise UserError(f"artifacts were built with extend graphs for prefill_chunk {list(built) or 'none'}, "
                        f"this request asks for {want}: rebuild with `compile build --prefill-chunk {want}` or "
                        f"change prefill_chunk", param="prefill_chunk")
    return built
