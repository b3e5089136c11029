"""The engine manifest: everything deploy / serve / generate / bench need, written last by `build`.

Frozen, keyword-only dataclasses; `to_dict` writes every field and `from_dict` requires every one, rejects unknown
keys (listing the valid ones), and `Manifest.from_dict(m.to_dict()) == m` holds. A manifest of another
MANIFEST_VERSION is refused with a rebuild line: the format has one version, and a change to it bumps the version
rather than teaching the reader a second layout.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from trtspec.checkpoint.model_shape import ModelShape, ReDrafterBeams
from trtspec.errors import BuildError, ConfigError, check_fields
from trtspec.outdir import chmod_as_created
from trtspec.model.quantize import QuantScheme, WeightDtype, min_step_slots
from trtspec.speculative.method import Method

MANIFEST_FILE = "manifest.json"
MANIFEST_VERSION = 6
# The onnx backend's graph contract (inputs, outputs, KV layout) the runtime runs: KV buffers [B, nkv, capacity, hd]
# bound as both past and present, the EAGLE draft's context graph scoring the rows `logit_rows` names. Kept apart
# from MANIFEST_VERSION so that a change to the CPU graphs refuses CPU engines only, not TensorRT-LLM engines.
ONNX_GRAPH_FORMAT = 3
MATMUL_NBITS, MATMUL_BLOCK = "matmulnbits", "block"
MATMUL_KERNELS = (MATMUL_NBITS, MATMUL_BLOCK)  # Manifest.matmul_kernel


class Backend(enum.Enum):
    ONNX = "onnx"
    TRTLLM = "trtllm"


def _check_complete(cls, data: dict, where: str) -> None:
    """Every field of dataclass `cls` is a key of `data`: a manifest holds every field `to_dict` writes."""
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in data]
    if missing:
        raise ConfigError(f"{where}: missing key{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}")


def _from_dict(cls, data: dict, where: str):
    """Build a dataclass from a dict holding every one of its fields, rejecting unknown keys with the list of valid
    ones."""
    check_fields(cls, data, where)
    _check_complete(cls, data, where)
    try:
        return cls(**data)
    except TypeError as e:
        raise ConfigError(f"{where}: {e}") from None


@dataclass(frozen=True, kw_only=True)
class Profile:
    """The static shapes the engine was built for. A generation step feeds one of `slot_profiles` (ascending, the
    last K + 1): the smallest that holds its draft, padded within it."""

    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_draft_len: int
    # the verify-step slot counts the engine runs: the onnx backend's profiles; a TensorRT-LLM engine's K + 1 alone
    # (its one step shape); () for a plain engine
    slot_profiles: tuple[int, ...]

    def __post_init__(self):
        for name in ("max_batch_size", "max_input_len", "max_seq_len"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_draft_len < 0:
            raise ConfigError(f"max_draft_len must be >= 0, got {self.max_draft_len}")
        if self.max_seq_len < self.max_input_len + self.max_draft_len + 1:
            raise ConfigError(
                f"max_seq_len={self.max_seq_len} is below max_input_len={self.max_input_len} + "
                f"max_draft_len={self.max_draft_len} + 1; raise --max-seq-len to at least "
                f"{self.max_input_len + self.max_draft_len + 1} or lower --max-input-len")
        object.__setattr__(self, "slot_profiles", tuple(self.slot_profiles))
        check_slot_profiles(self.slot_profiles, self.max_draft_len, "slot_profiles")
        if self.max_draft_len and self.slot_profiles[-1:] != (self.max_draft_len + 1,):
            raise ConfigError(f"slot_profiles {list(self.slot_profiles)}: the last profile must be "
                              f"max_draft_len + 1 = {self.max_draft_len + 1}")

    @property
    def tokens_per_step(self) -> int:
        """The most slots a generation step feeds (K + 1)."""
        return self.max_draft_len + 1

    @property
    def slots(self) -> tuple[int, ...]:
        """The slot counts a generation step may run, ascending (empty for a plain engine)."""
        return self.slot_profiles

    def profile_for(self, slots: int) -> int:
        """The smallest slot profile that holds `slots` slots (1: a plain step, no profile needed)."""
        if slots <= 1:
            return 1
        for size in self.slots:
            if size >= slots:
                return size
        raise ConfigError(f"a draft of {slots - 1} tokens does not fit the engine's max_draft_len "
                          f"{self.max_draft_len}")


def default_slot_profiles(max_draft_len: int) -> tuple[int, ...]:
    """2, 3, 5, 9, 17, ... (2^i + 1: a draft of 2^i tokens and its root) up to K + 1, and K + 1 itself."""
    if max_draft_len < 1:
        return ()
    sizes, power = [], 1
    while power + 1 < max_draft_len + 1:
        sizes.append(power + 1)
        power *= 2
    return (*sizes, max_draft_len + 1)


def check_slot_profiles(profiles, max_draft_len: int, what: str = "--profiles") -> None:
    """Slot counts must be ints, ascending, each within 2..K + 1."""
    shown = ",".join(map(str, profiles))
    for size in profiles:
        if isinstance(size, bool) or not isinstance(size, int):
            raise ConfigError(f"{what} {shown}: {size!r} is not a whole number of slots")
    if max_draft_len < 1 and profiles:
        raise ConfigError(f"{what} {shown}: a plain engine (max_draft_len 0) has no generation profiles")
    for prev, size in zip((None, *profiles), profiles):
        if size < 2:
            raise ConfigError(f"{what} {shown}: a profile of {size} slot(s) is below 2 (the root and one draft token); a "
                              "one-slot step is plain decoding, which every engine runs")
        if size > max_draft_len + 1:
            raise ConfigError(f"{what} {shown}: {size} slots is above max_draft_len + 1 = {max_draft_len + 1}")
        if prev is not None and size <= prev:
            raise ConfigError(f"{what} {shown}: slot counts must increase ({size} after {prev})")


def parse_slot_profiles(text: str, max_draft_len: int) -> tuple[int, ...]:
    """`--profiles 2,4,8`: checked slot counts, with K + 1 added when missing (a step must hold a K-token draft)."""
    try:
        profiles = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"--profiles {text}: expected slot counts separated by commas, e.g. 2,3,5,9,17") from None
    check_slot_profiles(profiles, max_draft_len)
    return profiles if profiles and profiles[-1] == max_draft_len + 1 else (*profiles, max_draft_len + 1)


@dataclass(frozen=True, kw_only=True)
class ModelInfo(ModelShape):
    """The manifest's `model` section: the checkpoint's ModelShape (read by the builder from its config.json) and
    what the build read beside it."""

    end_id: int | None = None  # from the tokenizer / config (None when unknown)
    pad_id: int | None = None
    draft_vocab_size: int = 0  # EAGLE: target ids the draft lm_head scores (d2t / t2d); 0 = the whole vocabulary

    @classmethod
    def of(cls, shape: ModelShape, *, end_id: int | None = None, pad_id: int | None = None,
           draft_vocab_size: int = 0) -> ModelInfo:
        fields = {f.name: getattr(shape, f.name) for f in dataclasses.fields(ModelShape)}
        return cls(**fields, end_id=end_id, pad_id=pad_id, draft_vocab_size=draft_vocab_size)

    @classmethod
    def from_dict(cls, data: dict, where: str) -> ModelInfo:
        check_fields(cls, data, where)
        _check_complete(cls, data, where)
        if isinstance(data.get("eagle"), dict):
            _check_complete(ModelShape, data["eagle"], f"{where}.eagle")
        return super().from_dict(data, where)


@dataclass(frozen=True, kw_only=True)
class WeightFormat:
    """How one component's matrices are stored: fp32, or int8 / int4 blocks for ONNX Runtime's MatMulNBits."""

    dtype: WeightDtype = WeightDtype.FP32
    block_size: int | None = None  # quantized: values per scale along the input dimension
    accuracy_level: int | None = None  # quantized: MatMulNBits accuracy_level (4: int8 activations)
    prequantized: str | None = None  # codes and scales read from the checkpoint as stored (its quant_algo)
    # int4: `symmetric` ((q - 8) · scale) or `min` (u · scale + the block's minimum; quantize.quantize_min)
    scheme: QuantScheme = QuantScheme.SYMMETRIC

    def __post_init__(self):
        try:
            object.__setattr__(self, "dtype", WeightDtype(self.dtype))
        except ValueError:
            raise ConfigError(f"weight format {self.dtype!r}: expected one of "
                              f"{', '.join(w.value for w in WeightDtype)}") from None
        try:
            object.__setattr__(self, "scheme", QuantScheme(self.scheme))
        except ValueError:
            raise ConfigError(f"weight scheme {self.scheme!r}: expected one of "
                              f"{', '.join(s.value for s in QuantScheme)}") from None
        if self.scheme is QuantScheme.MIN and self.dtype is not WeightDtype.INT4:
            raise ConfigError(f"weight scheme min: int4 only, not {self.dtype.value}")

    def __str__(self) -> str:
        if self.dtype is WeightDtype.FP32:
            return "fp32"
        source = f", from {self.prequantized}" if self.prequantized else ""
        scheme = ", with block minima" if self.scheme is QuantScheme.MIN else ""
        return f"{self.dtype.value} (block {self.block_size}{scheme}, accuracy level {self.accuracy_level}{source})"


@dataclass(frozen=True, kw_only=True)
class EngineWeights:
    """The weight format of each component (onnx backend; a TensorRT-LLM engine's stays fp32 here, its quantization
    is Manifest.quantization)."""

    linear: WeightFormat = WeightFormat()  # the target's qkv, o, gate_up, down
    lm_head: WeightFormat = WeightFormat()
    # the token embedding table; tied to a quantized lm_head it is that matrix's rows (GatherBlockQuantized)
    embedding: WeightFormat = WeightFormat()
    drafter: WeightFormat | None = None  # Medusa heads / EAGLE draft (None: the engine has none)
    # the target's linear layers as its context (prompt) graph reads them when not as `linear`: fp32 copies of the
    # dequantized matrices (build --fp32-prefill); None: the context graph reads `linear`'s blocks too
    prefill: WeightFormat | None = None

    @property
    def min_step_slots(self) -> int:
        """The fewest slots per row a decode step feeds the target (a plain step is padded to it) so that plain and
        verify steps compute a slot alike; see quantize.min_step_slots."""
        return max(min_step_slots(f.dtype) for f in (self.linear, self.lm_head))

    @property
    def has_block_minima(self) -> bool:
        """Whether a component is int4 with a minimum per block (its products end in trtspec's AddBlockOffsets)."""
        return any(f is not None and f.scheme is QuantScheme.MIN for f in (self.linear, self.lm_head, self.drafter))

    @property
    def chains_only(self) -> bool:
        """Whether the engine's verify steps compute a slot exactly as a plain step only on a chain (quantized target
        weights; see the note on quantize.PLAIN_STEP_SLOTS): drafters then draft chains."""
        return self.min_step_slots > 1

    def to_dict(self) -> dict:
        def fmt(f: WeightFormat | None) -> dict | None:
            if f is None:
                return None
            return {**dataclasses.asdict(f), "dtype": f.dtype.value, "scheme": f.scheme.value}
        return {name: fmt(getattr(self, name)) for name in ("linear", "lm_head", "embedding", "drafter", "prefill")}

    @classmethod
    def from_dict(cls, data: dict, where: str) -> EngineWeights:
        check_fields(cls, data, where)
        _check_complete(cls, data, where)
        return cls(**{k: None if v is None else _from_dict(WeightFormat, v, f"{where}.{k}") for k, v in data.items()})

    def summary(self) -> dict[str, str]:
        return {name: str(getattr(self, name)) for name in ("linear", "lm_head", "embedding", "drafter", "prefill")
                if getattr(self, name) is not None}


@dataclass(frozen=True, kw_only=True)
class Manifest:
    version: int = MANIFEST_VERSION
    name: str
    backend: Backend
    method: Method
    model: ModelInfo
    profile: Profile
    tree: tuple[tuple[int, ...], ...] | None = None  # choices (medusa / eagle)
    dynamic_tree: dict | None = None  # eagle2: depth, top_k, total_tokens
    files: dict[str, str] = field(default_factory=dict)  # role → path relative to the engine dir
    tokenizer: str | None = None  # relative path of the tokenizer folder, when the source had one
    source: str = ""
    versions: dict[str, str] = field(default_factory=dict)
    numerics: dict[str, float] = field(default_factory=dict)  # max |ORT − reference| / max(1, |reference|) per output
    # lookahead (W, N, G) as {"window_size", "ngram_size", "verification_set_size"}; K = f(W, N, G)
    lookahead: dict[str, int] | None = None
    # redrafter: the beam search built into the engine, {"num_beams", "draft_len_per_beam", "greedy_search"}
    # (model_shape.ReDrafterBeams); K = num_beams x draft_len_per_beam; null for every other method
    redrafter: dict | None = None
    tp_size: int = 1  # tensor-parallel ranks (trtllm engines: one rank{r}.engine per rank, one MPI rank per GPU)
    pp_size: int = 1
    graph_format: int | None = None  # onnx backend: ONNX_GRAPH_FORMAT of the graphs it built (trtllm: None)
    weights: EngineWeights = EngineWeights()  # onnx backend: the weight format per component
    # onnx backend: every file of the engine dir, {relative path: {"size", "blake2b"}} (engine.integrity); the
    # trtllm backend records none ({})
    checksums: dict[str, dict] = field(default_factory=dict)
    # trtllm backend: the TensorRT-LLM quantization it was planned with (engine.trtllm_quant; None: float weights)
    quantization: dict | None = None
    # onnx backend: the fewest rows the generation graph's attention runs over, a step of fewer tokens padded inside
    # the graph (onnx_ops.prelude; OrtEngine then feeds plain steps 1 slot where this CPU's kernels allow); 1 for
    # TreeAttention, which needs no padding
    attention_rows: int = 1
    # onnx backend: the target's attention kernels (onnx_ops.ATTENTION_KERNELS): "gqa" (ONNX Runtime's
    # GroupQueryAttention) or "tree" (trtspec/native: TreeAttention in the generation graph, where a slot computes
    # exactly as a plain step at any place of any tree, so quantized engines verify trees too; PromptAttention in the
    # context graph)
    attention: str = "gqa"
    # onnx backend: the kernel of the target's quantized products (decoder layers and lm_head, prompt and decode
    # steps): "matmulnbits" (ONNX Runtime's MatMulNBits) or "block" (trtspec's BlockMatMul, trtspec/native: the same
    # numbers, build --native-matmul)
    matmul_kernel: str = MATMUL_NBITS

    @property
    def chains_only(self) -> bool:
        """Whether verify steps compute a slot exactly as a plain step only on a chain: quantized target weights
        with GroupQueryAttention (see the note on quantize.PLAIN_STEP_SLOTS); drafters then draft chains. With
        TreeAttention every slot of a tree is exact."""
        return self.weights.chains_only and self.attention != "tree"

    @property
    def native_ops(self) -> tuple[str, ...]:
        """trtspec's own ONNX Runtime ops (trtspec/native) the engine's graphs run, which its sessions must load:
        TreeAttention and PromptAttention (attention "tree"), AddBlockOffsets (int4 weights with block minima),
        BlockMatMul and SkipRMSNorm (matmul kernel "block")."""
        from trtspec import native  # no onnx, no numpy: the serving path's import

        ops = (native.TREE_ATTENTION, native.PROMPT_ATTENTION) if self.attention == "tree" else ()
        if self.weights.has_block_minima:
            ops += (native.ADD_BLOCK_OFFSETS,)
        if self.matmul_kernel == MATMUL_BLOCK:
            ops += (native.BLOCK_MATMUL, native.SKIP_RMS_NORM)
        return ops

    def runnable_methods(self) -> tuple[str, ...]:
        """The methods a CPU engine with this manifest runs (`generate --method`, a deployment's `method`)."""
        from trtspec.speculative.methods import runnable_methods

        return runnable_methods(self.method.value, self.profile.max_draft_len, chains_only=self.chains_only)

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["backend"], d["method"] = self.backend.value, self.method.value
        d["tree"] = [list(c) for c in self.tree] if self.tree is not None else None
        d["weights"] = self.weights.to_dict()
        return d

    @classmethod
    def from_dict(cls, data: dict, where: str = MANIFEST_FILE) -> Manifest:
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: expected an object, found {type(data).__name__}")
        check_version(data, where)
        check_fields(cls, data, where)
        _check_complete(cls, data, where)
        try:
            data["backend"] = Backend(data["backend"])
        except ValueError as e:
            raise ConfigError(f"{where}: {e}") from None
        data["method"] = Method.expect(data["method"], Method.built_into_engines(), f"{where}: method")
        if data["backend"] is Backend.ONNX and data["graph_format"] != ONNX_GRAPH_FORMAT:
            raise BuildError(f"{where}: the engine's ONNX graphs are of format {data['graph_format']!r}, this "
                             f"trtspec runs format {ONNX_GRAPH_FORMAT}; rebuild the engine with this trtspec "
                             "(`trtspec build ... --force`)")
        data["model"] = ModelInfo.from_dict(data["model"], f"{where}: model")
        data["profile"] = _from_dict(Profile, data["profile"], f"{where}: profile")
        if data["tree"] is not None:
            data["tree"] = tuple(tuple(c) for c in data["tree"])
        if data["attention"] not in ("gqa", "tree"):
            raise ConfigError(f"{where}: attention {data['attention']!r} is not an attention kernel this trtspec runs "
                              "(gqa, tree)")
        if data["matmul_kernel"] not in MATMUL_KERNELS:
            raise ConfigError(f"{where}: matmul_kernel {data['matmul_kernel']!r} is not a kernel this trtspec runs "
                              f"({', '.join(MATMUL_KERNELS)})")
        data["weights"] = EngineWeights.from_dict(data["weights"], f"{where}: weights")
        _check_redrafter(data, where)
        return _from_dict(cls, data, where)

    def write(self, engine_dir: Path) -> Path:
        """Write manifest.json atomically (temp file + rename): the last file a build writes."""
        path = Path(engine_dir) / MANIFEST_FILE
        fd, tmp = tempfile.mkstemp(dir=engine_dir, prefix=".manifest-")
        with os.fdopen(fd, "w") as f:
            json.dump(self.to_dict(), f, indent=2)
            f.write("\n")
        chmod_as_created(tmp)
        os.replace(tmp, path)
        return path


def _check_redrafter(data: dict, where: str) -> None:
    """A ReDrafter engine's manifest has its beam search, whose K is the profile's; no other engine has one."""
    section, method = data["redrafter"], data["method"]
    if (section is None) != (method is not Method.REDRAFTER):
        raise ConfigError(f"{where}: method {method.value} with redrafter {section!r}; a redrafter engine records "
                          "its num_beams and draft_len_per_beam there, no other engine does")
    if section is None:
        return
    beams = ReDrafterBeams.from_dict(section, f"{where}: redrafter")
    if beams.max_draft_len != data["profile"].max_draft_len:
        raise ConfigError(f"{where}: redrafter num_beams {beams.num_beams} x draft_len_per_beam "
                          f"{beams.draft_len_per_beam} = {beams.max_draft_len}, but the profile's max_draft_len is "
                          f"{data['profile'].max_draft_len}")
    data["redrafter"] = beams.to_dict()


def check_version(data: dict, where: str) -> None:
    """Refuse, in one line, a manifest of another MANIFEST_VERSION (or none): its engine is rebuilt, not read."""
    version = data.get("version")
    if version == MANIFEST_VERSION:
        return
    found = "no manifest version" if version is None else f"manifest version {version!r}"
    newer = isinstance(version, int) and not isinstance(version, bool) and version > MANIFEST_VERSION
    raise BuildError(f"{where}: {found}, this trtspec reads version {MANIFEST_VERSION}: the engine was written by "
                     f"{'a later' if newer else 'an earlier'} trtspec; rebuild it with this one "
                     "(`trtspec build ... --force`)")


def check_decoded_on_cpu(manifest: Manifest, engine_dir: Path) -> None:
    """Refuse, in one line, an engine trtspec's CPU runtime does not decode: a TensorRT-LLM engine (or its plan),
    and a method it does not decode (Method.decoded_on_cpu: draft-target engines run on TensorRT-LLM only)."""
    if manifest.backend is not Backend.ONNX or manifest.method not in Method.decoded_on_cpu():
        what = (f"a TensorRT-LLM {manifest.method.value} engine" if manifest.backend is not Backend.ONNX
                else f"a {manifest.method.value} engine")
        raise ConfigError(f"{engine_dir}: {what} runs on a GPU host with TensorRT-LLM, not on trtspec's CPU "
                          f"runtime; serve it there (`trtspec deploy {engine_dir} --flavour trtllm`) and query it "
                          "with `trtspec generate --url HOST`")


def read_manifest(engine_dir: Path, *, check_files: bool = True) -> Manifest:
    """Read and validate an engine dir's manifest, and check that the files it lists exist at their recorded sizes
    (`check_files` False: the manifest alone, as `inspect` shows it beside the files that are not as built)."""
    engine_dir = Path(engine_dir)
    path = engine_dir / MANIFEST_FILE
    if not path.is_file():
        raise BuildError(f"{engine_dir}: no {MANIFEST_FILE}; not an engine directory (run `trtspec build` first)")
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise BuildError(f"{path}: unreadable manifest ({e})") from None
    manifest = Manifest.from_dict(data, str(path))
    if not check_files:
        return manifest
    for role, rel in manifest.files.items():
        if not (engine_dir / rel).is_file():
            raise BuildError(f"{path}: file {rel} ({role}) is missing from the engine directory")
    from trtspec.engine.integrity import check_sizes

    check_sizes(engine_dir, manifest.checksums)
    return manifest
