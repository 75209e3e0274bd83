"""Examples shown at the foot of each command's help (its epilog), so `sp-plan CMD --help` reads as a reference."""
from __future__ import annotations

import typer

#: command path -> example command lines, each with what it does
EXAMPLES: dict[str, list[tuple[str, str]]] = {
    "presets": [("sp-plan presets", "the cluster and model presets")],
    "plan": [
        ("sp-plan plan --cluster dgx-h100 --nodes 2 --model llama3-8b --seq-len 128k -o plan.yaml",
         "rank every layout of 16 GPUs and write the best"),
        ("sp-plan plan --cluster cluster.yaml --model llama3-70b --seq-len 1m --batch 16 --top 10",
         "your own cluster (from `sp-plan discover`), calibrated by its stored profile"),
        ("sp-plan plan --cluster dgx-h100 --nodes 128 --model llama3-70b --seq-len 1m --no-profile",
         "the presets' default model terms, no profile store"),
        ("sp-plan plan --cluster dgx-h100 --nodes 4 --model llama3-8b --seq-len 256k --sensitivity --report r.html",
         "does the winner hold when links or compute change; the HTML report"),
    ],
    "estimate": [("sp-plan estimate plan.yaml --cluster dgx-h100 --nodes 2",
                  "price a plan file on the cluster it names, with its model and workload"),
                 ("sp-plan estimate plan.yaml --cluster dgx-h100 --nodes 2 --seq-len 256k --batch 4",
                  "the same plan at another sequence length and batch")],
    "show": [("sp-plan show plan.yaml", "the layout, its groups and its predictions")],
    "discover": [("sp-plan discover -o cluster.yaml", "this host's devices, links and NICs"),
                 ("torchrun --nnodes 2 --nproc-per-node 8 --rdzv-endpoint HOST:29500 -m sp_plan.cli.app discover "
                  "-o cluster.yaml",
                  "every node of a multi-node world")],
    "profile links": [("torchrun --nproc-per-node 8 -m sp_plan.cli.app profile links --cluster cluster.yaml",
                       "measure the links and write the calibrated cluster back")],
    "profile list": [("sp-plan profile list", "the stored profiles, newest first"),
                     ("sp-plan profile list --cluster cluster.yaml", "only those of one cluster")],
    "profile show": [("sp-plan profile show 1a2b3c4d", "one profile's fits and measured candidates")],
    "profile export": [("sp-plan profile export 1a2b3c4d -o profile.yaml", "a profile as a file")],
    "profile import": [("sp-plan profile import profile.yaml", "store a profile file"),
                       ("sp-plan profile import profile.yaml --server http://planner:8000", "upload it to a service")],
    "profile delete": [("sp-plan profile delete 1a2b3c4d", "remove a profile from the store")],
    "tune": [("torchrun --nproc-per-node 8 -m sp_plan.cli.app tune --cluster cluster.yaml --model llama3-8b "
              "--seq-len 128k -o plan.yaml", "measure, calibrate and store a profile; write the best measured plan"),
             ("torchrun --nproc-per-node 4 -m sp_plan.cli.app tune --cluster cluster.yaml --model bert-large "
              "--seq-len 4k --budget 3 --max-minutes 9", "four CPU ranks on this host (cluster.yaml from a 4-rank "
              "`discover`)")],
    "report": [("sp-plan report plan.yaml -o report.html", "the HTML report of a plan file"),
               ("sp-plan report --cluster dgx-h100 --nodes 2 --model llama3-8b --seq-len 128k -o report.html",
                "the report of a fresh search")],
    "export": [("sp-plan export plan.yaml --to megatron", "Megatron-LM's flags for a plan"),
               ("sp-plan export plan.yaml --to torchtitan --nearest -o torchtitan.args",
                "the nearest plan torchtitan can express, if it cannot express this one")],
    "serve": [("sp-plan serve --port 8000", "the planner service on this host (API docs at /docs)"),
              ("sp-plan serve --host 0.0.0.0 --workers 4 --store postgresql+psycopg://db/sp --token-file tokens",
               "a team's service on PostgreSQL, writes with a token")],
}


def epilog(path: str) -> str | None:
    """The help epilog of a command: its examples, one paragraph each (rich help keeps paragraphs apart)."""
    lines = EXAMPLES.get(path)
    if not lines:
        return None
    return "Examples:\n\n" + "\n\n".join(f"{what}:\n\n  {cmd}" for cmd, what in lines)


def add_examples(app: typer.Typer, prefix: str = "") -> None:
    """Set every registered command's epilog (and its sub-groups' commands') from ``EXAMPLES``."""
    for info in app.registered_commands:
        name = info.name or info.callback.__name__.replace("_", "-")
        info.epilog = info.epilog or epilog(f"{prefix}{name}")
    for group in app.registered_groups:
        add_examples(group.typer_instance, f"{prefix}{group.name} ")
