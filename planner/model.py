"""ModelSpec and Workload: what is trained or served, on how many tokens (pydantic, YAML in/out)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .errors import PlanError
from .yamlio import load_yaml_model

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp64": 8}


class ModelSpec(BaseModel):
    """A decoder (or encoder) Transformer: the sizes the cost and memory formulas need."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "custom"
    layers: int = Field(gt=0)
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


class Workload(BaseModel):
    """One step: ``batch`` sequences of ``seq_len`` tokens, causal or not, training or inference."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seq_len: int = Field(gt=0)
    batch: int = Field(default=1, gt=0, description="global batch: sequences per optimizer step")
    causal: bool = True
    training: bool = True

    @field_validator("seq_len", mode="before")
    @classmethod
    def _seq(cls, v):
        return parse_seq_len(v)

    @property
    def tokens(self) -> int:
        return self.seq_len * self.batch
