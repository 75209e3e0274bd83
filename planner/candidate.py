"""Candidate: a light, hashable layout for the search hot path (a Plan is built only for the winners)."""
from __future__ import annotations

from dataclasses import dataclass, replace

from .plan import Plan


@dataclass(frozen=True)
class Candidate:
    """Algorithm, degrees, mesh order (innermost first), token layout and memory policy of one layout."""

    algorithm: str
    dp: int = 1
    pp: int = 1
    tp: int = 1
    ulysses: int = 1
    ring: int = 1
    order: tuple[str, ...] = ("dp",)
    token_layout: str = "contiguous"
    zero_stage: int = 0
    checkpointing: str = "none"
    micro_batch_size: int = 1
    team: int = 1
    placement: str | None = None
    stage_layers: tuple[int, ...] | None = None  # layers per pipeline stage; None: even, or balanced (planner/stages.py)
    virtual_stages: int = 1  # model chunks per pipeline rank (interleaved 1F1B); 1: plain 1F1B
    kv_chunks: int = 1  # all-gather's chunks of KV heads (planner/allgather.py); 1: one gather, exposed

    @property
    def degrees(self) -> dict[str, int]:
        return {"dp": self.dp, "pp": self.pp, "tp": self.tp, "ulysses": self.ulysses, "ring": self.ring, "team": self.team}

    @property
    def world(self) -> int:
        return self.dp * self.pp * self.tp * self.ulysses * self.ring

    @property
    def sp(self) -> int:
        return self.ulysses * self.ring

    def but(self, **changes) -> "Candidate":
        """This candidate with ``changes`` (fields by name), as ``dataclasses.replace`` makes it but without calling
        __init__ again: the search copies ~10^4 candidates, and a frozen dataclass's __init__ sets each field through
        object.__setattr__."""
        unknown = changes.keys() - self.__dict__.keys()
        if unknown:
            raise TypeError(f"Candidate has no field {sorted(unknown)[0]!r}")
        c = object.__new__(Candidate)
        c.__dict__.update(self.__dict__)
        c.__dict__.update(changes)
        return c

    def with_memory(self, zero_stage: int, checkpointing: str, micro_batch_size: int) -> "Candidate":
        return replace(self, zero_stage=zero_stage, checkpointing=checkpointing, micro_batch_size=micro_batch_size)

    @classmethod
    def from_plan(cls, p: Plan) -> "Candidate":
        d = p.degrees
        return cls(algorithm=p.algorithm, dp=d["dp"], pp=d["pp"], tp=d["tp"], ulysses=d["ulysses"], ring=d["ring"],
                   order=tuple(p.order), token_layout=p.token_layout, zero_stage=p.zero_stage,
                   checkpointing=p.checkpointing, micro_batch_size=p.micro_batch_size, team=d.get("team", 1),
                   placement=p.placement, stage_layers=tuple(p.stage_layers) if p.stage_layers is not None else None,
                   virtual_stages=p.virtual_stages or 1, kv_chunks=p.kv_chunks or 1)

    def to_plan(self, **extra) -> Plan:
        return Plan(algorithm=self.algorithm, degrees=self.degrees, order=list(self.order),
                    token_layout=self.token_layout, zero_stage=self.zero_stage, checkpointing=self.checkpointing,
                    micro_batch_size=self.micro_batch_size, placement=self.placement,
                    stage_layers=list(self.stage_layers) if self.stage_layers is not None else None,
                    virtual_stages=self.virtual_stages if self.virtual_stages != 1 else None,
                    kv_chunks=self.kv_chunks if self.kv_chunks != 1 else None, **extra)
