#!/usr/bin/env bash
# Plan a preset and read the plan file: rank every layout of Llama 3 8B at 128k tokens on two DGX H100 nodes,
# write the fastest as plan.yaml, then print that file's layout, rank groups and predicted step.
#
#     bash examples/plan_and_show.sh [WORKDIR]      # WORKDIR: where plan.yaml goes (default: a new temporary folder)
#
# Takes a few seconds on a laptop; nothing is measured, so no GPU is needed.
set -euo pipefail
WORKDIR="${1:-$(mktemp -d)}"
mkdir -p "$WORKDIR" && cd "$WORKDIR"

# the ranked table, the best layout of each algorithm and the winner's breakdown; the winner goes to plan.yaml
sp-plan plan --cluster dgx-h100 --nodes 2 --model llama3-8b --seq-len 128k --top 5 -o plan.yaml

# what the plan file holds: the layout, the rank groups of each dimension and the prediction
sp-plan show plan.yaml
echo "plan file: $PWD/plan.yaml"
