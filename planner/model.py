"""ModelSpec and Workload: what is trained or served, on how many tokens (pydantic, YAML in/out)."""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from .errors import PlanError
from .yamlio import load_yaml_model

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp64": 8}


class ModelSpec(BaseModel):
    """A decoder (or encoder) Transformer: the sizes the cost and memory formulas need."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "custom"
    layers: int = Field(gt=0, le=10_000, description="transformer blocks (at most 10,000: beyond any model, and the "
                        "stage balancing walks them)")
    hidden: int = Field(gt=0)
    heads: int = Field(gt=0)
    kv_heads: int | None = Field(default=None, gt=0, description="KV heads (GQA/MQA); defaults to heads")
    head_dim: int | None = Field(default=None, gt=0, description="defaults to hidden // heads")
    ffn_hidden: int | None = Field(default=None, gt=0, description="defaults to 4 * hidden")
    gated_mlp: bool = Field(default=False, description="SwiGLU-style MLP with three matrices (LLaMA)")
    vocab: int = Field(default=32000, ge=0)
    dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    source: str = ""

    @model_validator(mode="after")
    def _defaults(self):
        kv = self.kv_heads or self.heads
        object.__setattr__(self, "kv_heads", kv)
        if self.head_dim is None:
            if self.hidden % self.heads:
                raise PlanError("model.head_dim", f"hidden {self.hidden} is not divisible by heads {self.heads}",
                                "set head_dim explicitly or fix hidden/heads")
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        if self.ffn_hidden is None:
            object.__setattr__(self, "ffn_hidden", 4 * self.hidden)
        if self.heads % kv:
            raise PlanError("model.kv_heads", f"heads {self.heads} is not a multiple of kv_heads {kv}",
                            "kv_heads must divide heads (GQA groups)")
        return self

    def tp_problem(self, tp: int) -> str | None:
        """Why tensor parallelism of degree ``tp`` cannot split this model's layers, or None: Megatron TP gives each
        rank whole query heads, whole KV head groups and an even share of the FFN (Megatron-LM asserts the same).
        The one rule the search, the estimate and the bundled runtime share."""
        if tp > 1 and (self.heads % tp or self.kv_heads % tp or self.ffn_hidden % tp):
            return f"tp {tp} must divide heads {self.heads}, kv heads {self.kv_heads} and ffn {self.ffn_hidden}"
        return None

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def layer_params(self) -> int:
        """Weights of one block: Q, K, V, O projections and the MLP (norms and biases ignored)."""
        attn = self.hidden * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.hidden
        mlp = (3 if self.gated_mlp else 2) * self.hidden * self.ffn_hidden
        return attn + mlp

    def params(self) -> int:
        """All weights: blocks plus input embedding and (untied) output head."""
        return self.layers * self.layer_params() + 2 * self.vocab * self.hidden

    @classmethod
    def load(cls, path: str | Path) -> "ModelSpec":
        return load_yaml_model(cls, path, "model")


SEQ_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kKmMgG]?)\s*$", re.ASCII)
#: longer than any sequence a cluster could hold (a trillion tokens): a typo, refused before any arithmetic
MAX_SEQ_LEN = 2**40
#: sequences per step at most: beyond any batch trained, and the search walks the batch's divisors
MAX_BATCH = 2**30
#: the largest seed a Bayesian search takes: optuna's TPESampler seeds numpy's RandomState, which takes 0 to 2**32 - 1
MAX_SEED = 2**32 - 1
#: the most optuna trials a bayes search takes. TPE's cost per trial grows with the trials before it (tiny-gpt on
#: dgx-h100, CPU seconds: 1,000 trials 3, 4,000 44, 10,000 262), and the default 200 already finds the grid's best
#: there, so 10,000 is past any useful study; more is a typo that would hold a search process for days
#: documents a pack holds on average, at most: pricing places each one (about 3 us each, for each layout and pack
#: drawn), and no corpus packs documents of a few tokens into sequences of a million
MAX_DOCUMENTS_PER_PACK = 65_536
MAX_TRIALS = 10_000
#: ranked layouts a plan or report lists at most (each row is drawn and explained)
MAX_TOP = 1000
#: optuna trials of a Bayesian search where none are given
DEFAULT_TRIALS = 200


def parse_seq_len(text: str | int) -> int:
    """Parse 131072, 128k (=131072) or 1m (=1048576): k and m are binary (x1024)."""
    if isinstance(text, int):
        value = text
    else:
        m = SEQ_RE.match(str(text))
        if not m:
            raise PlanError("seq_len", f"cannot read {text!r}", "write a number like 131072, 128k or 1m")
        mult = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}[m.group(2).lower()]
        f = float(m.group(1)) * mult
        if not f <= MAX_SEQ_LEN:
            raise PlanError("seq_len", f"{text!r} is more than {MAX_SEQ_LEN:,} tokens", "give a length like 128k or 1m")
        if f != int(f):
            raise PlanError("seq_len", f"{text!r} is not a whole number of tokens", "use an integer length")
        value = int(f)
    if value <= 0:
        raise PlanError("seq_len", f"must be positive, got {value}", "give a length like 128k")
    if value > MAX_SEQ_LEN:
        raise PlanError("seq_len", f"{value:,} is more than {MAX_SEQ_LEN:,} tokens", "give a length like 128k or 1m")
    return value


_FROZEN = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
#: lengths given one by one, at most (the workload is hashed per priced layout): a file's are summarised as a histogram
MAX_INLINE_LENGTHS = 10_000


def _positive_lengths(field: str, values, fix: str) -> None:
    """Lengths are whole tokens, at least one each: a zero or negative one is named with its position."""
    for i, x in enumerate(values):
        if isinstance(x, (int, float)) and x < 1:  # other types: pydantic names them
            raise PlanError(f"{field}[{i}]", f"a document length must be at least 1 token, got {x}", fix)


class DocumentLengths(BaseModel):
    """Document lengths given one by one (a sample of the user's data): packs draw from them with replacement."""

    model_config = _FROZEN
    kind: Literal["lengths"] = "lengths"
    lengths: tuple[int, ...] = Field(description="document lengths in tokens, a sample of the data")
    source: str = Field(default="inline", description="where the lengths came from: inline or a file's name")
    sha256: str | None = Field(default=None, description="of the source file, when the lengths were read from one")
    _longest: int = PrivateAttr(default=0)  # max(lengths), read wherever the mask is priced

    @model_validator(mode="after")
    def _check(self):
        if not self.lengths:
            raise PlanError("workload.documents.lengths", "is empty", "give at least one document length")
        if len(self.lengths) > MAX_INLINE_LENGTHS:
            raise PlanError("workload.documents.lengths", f"{len(self.lengths):,} lengths inline",
                            "summarise a large sample as a histogram (planner.documents.histogram_of)")
        _positive_lengths("workload.documents.lengths", self.lengths, "drop empty documents from the sample")
        self._longest = max(self.lengths)
        return self


#: the widest lognormal a workload takes (sigma, the standard deviation of ln length). Fitted corpora sit near 1-2
#: (Megatron's mock dataset 1.5 and 1.8); at sigma 10, mu = ln(mean) - 50, so nearly every draw lands on min or max
#: and the distribution says nothing more; far beyond, sigma**2 overflows a float
MAX_SIGMA = 10.0


class Lognormal(BaseModel):
    """Document lengths exp(N(mu, sigma^2)) with mu = ln(mean) - sigma^2/2, clipped to [min, max] and floored
    (Megatron-LM's MockVarlenLowLevelDataset: ``mean`` is the untruncated distribution's mean)."""

    model_config = _FROZEN
    kind: Literal["lognormal"] = "lognormal"
    mean: float = Field(gt=0, description="mean length of the distribution before clipping, tokens")
    sigma: float = Field(gt=0, description="standard deviation of ln(length)")
    min: int = Field(ge=1, description="shortest document, tokens (shorter draws are raised to it)")
    max: int = Field(ge=1, description="longest document, tokens (longer draws are cut to it)")
    name: str = ""
    source: str = ""

    @model_validator(mode="after")
    def _check(self):
        if self.min > self.max:
            raise PlanError("workload.documents.min", f"min {self.min} is above max {self.max}", "give min <= max")
        if self.sigma > MAX_SIGMA:
            raise PlanError("workload.documents.sigma", f"{self.sigma:g} is wider than any corpus of documents",
                            f"give a sigma (the standard deviation of ln length) above 0 and at most {MAX_SIGMA:g}, "
                            "e.g. 1.5")
        return self


class Histogram(BaseModel):
    """Document lengths by bins: bin i is chosen with probability weights[i] / sum(weights), then a length uniform
    over the integers max(edges[i], 1) <= L < edges[i+1] (MagiAttention's generate_seqlens draws randint(a, b), both
    ends included: the same to within one token per bin)."""

    model_config = _FROZEN
    kind: Literal["histogram"] = "histogram"
    edges: tuple[int, ...] = Field(description="bin edges in tokens, increasing")
    weights: tuple[float, ...] = Field(description="one weight per bin (any scale, not all zero)")
    name: str = ""
    source: str = Field(default="", description="where the histogram comes from: a citation or a file's name")
    sha256: str | None = Field(default=None, description="of the source file, when it was summarised from one")

    @model_validator(mode="after")
    def _check(self):
        e, w = self.edges, self.weights
        if len(e) < 2 or len(w) != len(e) - 1:
            raise PlanError("workload.documents.weights", f"{len(w)} weights for {len(e)} edges",
                            "give one weight per bin: len(weights) = len(edges) - 1 >= 1")
        if e[0] < 0 or any(b <= a for a, b in zip(e, e[1:])):
            raise PlanError("workload.documents.edges", f"{list(e)} is not increasing from >= 0",
                            "list bin edges in tokens, increasing")
        if any(x < 0 for x in w) or not sum(w) > 0:
            raise PlanError("workload.documents.weights", f"{list(w)} has a negative weight or sums to zero",
                            "give non-negative weights, at least one positive")
        for i, x in enumerate(w):
            if x > 0 and e[i + 1] <= max(e[i], 1):
                raise PlanError("workload.documents.edges", f"bin {e[i]}..{e[i + 1]} holds no length of 1 token or more",
                                "start the bins at 0 or 1 and give each weighted bin at least one length")
        return self


def masking_window(size: int | None, longest: int) -> int | None:
    """``size``, or None where the window covers the longest document (``size >= longest``): a query then sees its
    whole document, which is full attention, planned and run as such."""
    return None if size is None or size >= longest else size


def _longest(d) -> int:
    """The longest document ``d`` can draw, before packing cuts it to the sequence: its longest length, a lognormal's
    clip, the last weighted bin's highest length."""
    if d.kind == "lengths":
        return d._longest or max(d.lengths)  # 0: built without validation (model_construct)
    if d.kind == "lognormal":
        return d.max
    return max(d.edges[i + 1] for i, w in enumerate(d.weights) if w > 0) - 1


Documents = Annotated[Union[DocumentLengths, Lognormal, Histogram], Field(discriminator="kind")]

PATTERN_RE = re.compile(r"^\s*([0-9]+)\s*:\s*([0-9]+)\s*$", re.ASCII)


class Window(BaseModel):
    """A sliding window of ``size`` tokens: a query attends keys less than ``size`` positions away (causal: itself and
    the size - 1 before, as transformers' ``sliding_window``), on every layer or on the local layers of ``pattern``
    ("5:1": five windowed layers, then one global, repeating, as Gemma 3)."""

    model_config = _FROZEN
    size: int = Field(description="window in tokens, at least 1")
    pattern: str | None = Field(default=None, description="local:global layers, e.g. 5:1; absent: every layer")

    @model_validator(mode="after")
    def _check(self):
        if self.size < 1:
            raise PlanError("workload.window", f"must be at least 1 token, got {self.size}",
                            "give a window size W >= 1 (or no window for full attention)")
        if self.pattern is not None:
            self.local_global()
        return self

    def local_global(self) -> tuple[int, int]:
        """(windowed, global) layers of one repeat of the pattern; (1, 0) without one (every layer windowed)."""
        if self.pattern is None:
            return 1, 0
        m = PATTERN_RE.match(self.pattern)
        if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
            raise PlanError("workload.window.pattern", f"cannot read {self.pattern!r}",
                            "write local:global layer counts, both at least 1, e.g. 5:1")
        return int(m.group(1)), int(m.group(2))

    def layer_window(self, layer: int) -> int | None:
        """The window of layer ``layer`` (0-based), or None where the pattern puts a global layer."""
        local, glob = self.local_global()
        return self.size if layer % (local + glob) < local else None

    def windowed_layers(self, layers: int) -> int:
        """How many of ``layers`` layers are windowed."""
        local, glob = self.local_global()
        full, rest = divmod(layers, local + glob)
        return full * local + min(rest, local)


def micro_batches(batch: int, dp: int, mbs: int) -> int:
    """Micro-batches each data-parallel replica runs a step: B / (dp x micro-batch size), at least one."""
    return max(batch // (dp * mbs), 1)


class Workload(BaseModel):
    """One step: ``batch`` sequences of ``seq_len`` tokens, causal or not, training or inference."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seq_len: int = Field(gt=0)
    batch: int = Field(default=1, gt=0, le=MAX_BATCH,
                       description="global batch: sequences per optimizer step (at most 2^30)")
    causal: bool = True
    training: bool = True
    documents: Documents | None = Field(default=None, description="lengths of the documents packed into each "
                                        "sequence (a list, a lognormal or a histogram); absent: one per sequence")
    window: Window | None = Field(default=None, description="sliding window (an integer: on every layer)")
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED,
                             description="seed of the packs drawn from documents (default 0; at most 2^32 - 1)")

    @field_validator("seq_len", mode="before")
    @classmethod
    def _seq(cls, v):
        return parse_seq_len(v)

    @field_validator("documents", mode="before")
    @classmethod
    def _documents(cls, v):
        """A list of lengths is a DocumentLengths; a name needs its definition, which the application looks up."""
        if isinstance(v, str):
            raise PlanError("workload.documents", f"{v!r} names a distribution, and the planner takes definitions",
                            "resolve the name with sp_plan.profiles.documents.load_documents (the CLI and API do)")
        if isinstance(v, (list, tuple)):
            _positive_lengths("workload.documents", v, "give document lengths of at least 1 token")
            return {"kind": "lengths", "lengths": tuple(v)}
        return v

    @field_validator("window", mode="before")
    @classmethod
    def _window(cls, v):
        """An integer window applies to every layer."""
        if isinstance(v, bool):
            raise PlanError("workload.window", f"must be a size in tokens, got {v!r}", "give a window size W >= 1")
        if isinstance(v, int):
            if v < 1:
                raise PlanError("workload.window", f"must be at least 1 token, got {v}",
                                "give a window size W >= 1 (or no window for full attention)")
            return {"size": v}
        return v

    @model_validator(mode="after")
    def _mask_sizes(self):
        """Window and document lengths at most MAX_SEQ_LEN tokens (what a sequence may hold): beyond it the packs'
        int64 arithmetic would overflow."""
        w, d, top = self.window, self.documents, MAX_SEQ_LEN
        if w is not None and w.size > top:
            raise PlanError("workload.window", f"{w.size:,} tokens is more than any sequence ({top:,})",
                            "give a window of at most the sequence length (that is full attention)")
        longest = {"lengths": lambda: max(d.lengths), "lognormal": lambda: max(d.max, d.mean),
                   "histogram": lambda: d.edges[-1] - 1}[d.kind]() if d is not None else 0
        if longest > top:
            raise PlanError("workload.documents", f"a document of {longest:,.0f} tokens is more than any sequence "
                            f"({top:,})", f"give document lengths of at most {top:,} tokens")
        return self

    @model_validator(mode="after")
    def _pack_count(self):
        """At most MAX_DOCUMENTS_PER_PACK documents a pack on average: pricing places each one, so a pack of many
        thousands of few-token documents held a search for minutes."""
        if self.documents is None:
            return self
        from .documents import mean_length  # noqa: PLC0415 - documents.py reads this module's models

        mean = min(mean_length(self.documents), self.seq_len)
        count = self.seq_len / mean
        if count > MAX_DOCUMENTS_PER_PACK:
            least = math.ceil(self.seq_len / MAX_DOCUMENTS_PER_PACK)
            raise PlanError("workload.documents", f"a pack of {self.seq_len:,} tokens holds about {count:,.0f} "
                            f"documents of {mean:,.1f} tokens on average, more than the {MAX_DOCUMENTS_PER_PACK:,} "
                            "the planner prices", f"give documents of at least {least:,} tokens on average at this "
                            "length, or a shorter sequence")
        return self

    @model_validator(mode="after")
    def _pack_seed(self):
        if self.documents is None and self.seed is not None:
            raise PlanError("workload.seed", "seeds the packs drawn from documents, and there are none",
                            "give documents, or drop seed")
        if self.documents is not None and self.seed is None:
            object.__setattr__(self, "seed", 0)  # recorded: the same inputs give the same packs
        return self

    @property
    def longest_document(self) -> int:
        """The most tokens one document of a pack can hold: the sequence, or the documents' longest where shorter (a
        longer one is cut into sequence-length pieces)."""
        d = self.documents
        return self.seq_len if d is None else min(self.seq_len, _longest(d))

    @property
    def mask_window(self) -> Window | None:
        """The window that masks: None where it covers every document (a query then sees its whole document, which
        is full attention, and is planned and run as such)."""
        w = self.window
        return None if w is None or masking_window(w.size, self.longest_document) is None else w

    @property
    def mixes_windows(self) -> bool:
        """Whether the layers attend under different masks: a window pattern whose window masks (windowed and global
        layers alike hold a sequence's tokens in one placement)."""
        w = self.mask_window
        return w is not None and w.pattern is not None

    @property
    def notes(self) -> list[str]:
        """What the workload means that its fields do not say outright (a window that covers every document)."""
        w = self.window
        if w is None or self.mask_window is not None:
            return []
        if w.size >= self.seq_len:
            return [f"window {w.size} covers the {self.seq_len}-token sequence: full attention on its layers"]
        return [f"window {w.size} covers every document (at most {self.longest_document} tokens): full attention "
                "on its layers"]

    @property
    def tokens(self) -> int:
        return self.seq_len * self.batch
