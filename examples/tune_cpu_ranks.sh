#!/usr/bin/env bash
# Tune on CPU ranks: the steps of `sp-plan tune` on your cluster, on 2 gloo ranks of this machine under torchrun.
# Discover the world, measure its links, kernels and two candidate layouts of a tiny Llama, calibrate the model to
# them, store the profile; then plan with it. On GPUs, run the same commands with --nproc-per-node set to the GPUs
# of a node (and --nnodes for several nodes), your model and sequence length, and tune's default budget.
#
#     bash examples/tune_cpu_ranks.sh [WORKDIR]    # WORKDIR: cluster file, store, plan (default: a temporary folder)
#
# About a minute on a 2-core machine; needs torch (CPU is enough), nothing is downloaded.
set -euo pipefail
WORKDIR="${1:-$(mktemp -d)}"
mkdir -p "$WORKDIR" && cd "$WORKDIR"
RUN=(torchrun --standalone --nproc-per-node 2 -m sp_plan.cli.app)   # torchrun runs sp-plan on each rank
STORE="sqlite:///$PWD/store.db"                                      # a store of its own, not your default one

# 1. the cluster as its ranks see it: devices, links and NICs, written to cluster.yaml
"${RUN[@]}" discover -o cluster.yaml

# 2. measure and calibrate: 2 candidates at most (--budget), 2 timed steps each, one reading (--confirm 0),
#    the link step at two message sizes; the best measured layout is written to plan.yaml
"${RUN[@]}" tune --cluster cluster.yaml --model tiny-llama --seq-len 512 \
  --budget 2 --iters 2 --confirm 0 --link-sizes 16K,64K --store "$STORE" -o plan.yaml

# 3. plan on the tuned cluster: the stored profile prices every layout (the line "using profile ..." says which)
sp-plan plan --cluster cluster.yaml --model tiny-llama --seq-len 512 --store "$STORE" --top 3
sp-plan profile list --store "$STORE"
