"""Parse `nvidia-smi topo -m` (the GPU/NIC connection matrix) and `nvidia-smi --query-gpu` CSV."""
from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field

from sp_plan.planner.errors import PlanError

LEVELS = ("PIX", "PXB", "PHB", "NODE", "SYS")  # PCIe distance, nearest first (nvidia-smi's legend)
LEVEL_RANK = {lv: i for i, lv in enumerate(LEVELS)}
_ALIASES = {"SOC": "SYS", "CPU": "PHB"}  # names used by old drivers
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NV = re.compile(r"^NV(\d+)$")


@dataclass
class TopoMatrix:
    """The parsed matrix: GPU and NIC labels, cells between them, CPU/NUMA affinity per GPU."""

    gpus: list[str]  # "GPU0", "GPU1", ... in matrix order
    nics: list[str]  # real NIC names ("mlx5_0"), via the NIC legend when the matrix says "NIC0"
    cells: dict[tuple[str, str], str] = field(default_factory=dict)
    cpu_affinity: dict[str, str] = field(default_factory=dict)
    numa: dict[str, int | None] = field(default_factory=dict)

    def nvlinks(self, a: str, b: str) -> int:
        """Bonded NVLinks between two labels (0 if the cell is not NV#)."""
        m = _NV.match(self.cells.get((a, b), ""))
        return int(m.group(1)) if m else 0

    def pcie(self, a: str, b: str) -> str | None:
        """PCIe level (PIX ... SYS) between two labels, or None where the matrix shows NVLink or nothing."""
        c = self.cells.get((a, b), "")
        return c if c in LEVEL_RANK else None


def _tokens(line: str) -> list[str]:
    return line.split()


def parse_topo(text: str, source: str = "nvidia-smi topo -m") -> TopoMatrix:
    """Parse the text of `nvidia-smi topo -m` (tabs or spaces, with or without the NIC legend)."""
    lines = [_ANSI.sub("", ln).rstrip("\n") for ln in text.splitlines()]
    head = next((i for i, ln in enumerate(lines) if _tokens(ln)[:1] == ["GPU0"]), None)
    if head is None:
        raise PlanError("topo", f"{source}: no header row starting with GPU0",
                        "pass the unmodified output of `nvidia-smi topo -m`")
    labels: list[str] = []
    for tok in _tokens(lines[head]):
        if tok in ("CPU", "NUMA", "GPU") and labels:  # "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"
            break
        labels.append(tok)
    has_numa = "NUMA" in _tokens(lines[head])
    legend = {}
    for ln in lines:
        m = re.match(r"^\s+(NIC\d+):\s*(\S+)\s*$", ln)
        if m:
            legend[m.group(1)] = m.group(2)
    real = {lb: legend.get(lb, lb) for lb in labels}
    gpus = [lb for lb in labels if re.fullmatch(r"GPU\d+", lb)]
    nics = [real[lb] for lb in labels if lb not in gpus]
    topo = TopoMatrix(gpus=gpus, nics=nics)
    seen = set()
    for ln in lines[head + 1:]:
        toks = _tokens(ln)
        if not toks or toks[0] == "Legend:":
            if seen:
                break
            continue
        row = toks[0]
        if row not in real:
            if seen:
                break
            continue
        cells = toks[1:1 + len(labels)]
        if len(cells) < len(labels):
            raise PlanError("topo", f"{source}: row {row} has {len(cells)} cells for {len(labels)} columns",
                            "pass the unmodified output of `nvidia-smi topo -m`")
        seen.add(row)
        for col, cell in zip(labels, cells):
            topo.cells[(real[row], real[col])] = _ALIASES.get(cell, cell)
        rest = toks[1 + len(labels):]
        if row in gpus and rest:
            topo.cpu_affinity[row] = rest[0]
            if has_numa and len(rest) > 1:
                topo.numa[row] = int(rest[1]) if re.fullmatch(r"[0-9]+", rest[1]) else None
    missing = [lb for lb in gpus if lb not in seen]
    if missing:
        raise PlanError("topo", f"{source}: rows missing for {missing}", "pass the whole output of `nvidia-smi topo -m`")
    return topo


def parse_query_gpu(text: str) -> list[dict]:
    """Parse `nvidia-smi --query-gpu=index,name,memory.total,pci.bus_id --format=csv,noheader,nounits`."""
    rows = []
    for ln in text.strip().splitlines():
        parts = [p.strip() for p in ln.split(",")]
        if len(parts) < 4 or not re.fullmatch(r"[0-9]+", parts[0]):
            continue
        mem = float(parts[2]) * 2**20 if re.fullmatch(r"[0-9]+(?:\.[0-9]*)?", parts[2]) else 0.0
        rows.append({"index": int(parts[0]), "name": parts[1], "memory_bytes": mem, "pci_bus": parts[3]})
    return rows


def run_smi(*args: str, timeout: float = 30.0) -> tuple[str | None, str]:
    """Run nvidia-smi with ``args``; (stdout, "") or (None, why it could not)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None, "nvidia-smi not found on PATH"
    try:
        p = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"nvidia-smi {' '.join(args)} timed out after {timeout:.0f}s"
    except OSError as e:
        return None, f"nvidia-smi failed to start: {e}"
    if p.returncode != 0:
        why = (p.stderr or p.stdout).strip().splitlines()
        return None, f"nvidia-smi {' '.join(args)} exited {p.returncode}" + (f": {why[0]}" if why else "")
    return p.stdout, ""
