"""GET /v1/plans/{id}/report: the ranked table and the winner's breakdown as one plain HTML page."""
from __future__ import annotations

from html import escape

from sp_plan.service.planning import PlanResponse


def _secs(x: float) -> str:
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.3f} s"


def _table(head: list[str], rows: list[list[str]]) -> str:
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def render(res: PlanResponse) -> str:
    """The page: header, ranked layouts, the winner's per-phase breakdown."""
    c, w, win = res.cluster, res.workload, res.winner
    ranked = [[str(i + 1), p.summary(), _secs(p.predicted.step_time_s), f"{p.predicted.tokens_per_s:,.0f}",
               f"{p.predicted.mfu:.1%}", f"{p.predicted.peak_memory_bytes / 2**30:.1f} GiB"]
              for i, p in enumerate(res.plans)]
    phases = [[b.name, b.kind, b.group or "", f"{b.bytes_per_rank / 2**30:.2f} GiB" if b.bytes_per_rank else "",
               _secs(b.seconds), _secs(b.exposed_seconds)] for b in win.predicted.breakdown]
    title = f"{c.name}: {res.model.name}, {w.seq_len:,} tokens x {w.batch}"
    return ("<!doctype html><html><head><meta charset='utf-8'><title>sp-plan: " + escape(title) + "</title>"
            "<style>body{font-family:sans-serif}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
            "padding:2px 8px;text-align:right}td:nth-child(2){text-align:left}</style></head><body>"
            f"<h1>{escape(title)}</h1><p>{c.nodes} node(s), {c.world_size} x {escape(c.device)}, fingerprint "
            f"{escape(c.fingerprint)}; {escape(res.profile_line)}</p>"
            "<h2>ranked layouts (fastest first)</h2>"
            + _table(["#", "layout", "step", "tokens/s", "MFU", "peak mem"], ranked)
            + f"<h2>breakdown of {escape(win.summary())}</h2>"
            + _table(["phase", "kind", "group", "bytes/rank", "seconds", "exposed"], phases)
            + "</body></html>")
