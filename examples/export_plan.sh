#!/usr/bin/env bash
# Export a plan to every framework sp-plan knows: Megatron-LM, torchtitan, DeepSpeed, yunchang, accelerate and
# (for inference) xDiT. A framework that cannot express the plan exits 2 naming the nearest plan it can;
# --nearest exports that one instead.
#
#     bash examples/export_plan.sh [WORKDIR]     # WORKDIR: the plans and exports (default: a temporary folder)
#
# Takes under a minute; no GPU and none of the frameworks are needed to write their configuration.
set -euo pipefail
WORKDIR="${1:-$(mktemp -d)}"
mkdir -p "$WORKDIR" && cd "$WORKDIR"

# a training plan: Llama 3 8B, 128k tokens, two DGX H100 nodes (the winner is USP, Ulysses x Ring)
sp-plan plan --cluster dgx-h100 --nodes 2 --model llama3-8b --seq-len 128k -o plan.yaml > /dev/null

# Megatron-LM and yunchang run USP: the plan as it is
sp-plan export plan.yaml --to megatron -o megatron.args
sp-plan export plan.yaml --to yunchang -o yunchang.py

# torchtitan has all-gather context parallelism only, DeepSpeed Ulysses only, accelerate one or the other: without --nearest each
# exits 2 naming the nearest plan it can run; with it, that plan is exported and the line says how much slower
sp-plan export plan.yaml --to torchtitan --nearest -o torchtitan.args
sp-plan export plan.yaml --to deepspeed --nearest -o deepspeed.json
sp-plan export plan.yaml --to accelerate --nearest -o accelerate_setup.py

# xDiT runs diffusion inference: plan a DiT for inference, full (non-causal) attention, then export it
sp-plan plan --cluster dgx-h100 --model dit-1b --seq-len 64k --inference --no-causal -o dit.yaml > /dev/null
sp-plan export dit.yaml --to xdit -o xdit.args

head -n 20 megatron.args deepspeed.json xdit.args
echo "exports in $PWD: $(ls | tr '\n' ' ')"
