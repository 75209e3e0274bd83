#!/usr/bin/env bash
# Every GPU path of sp-plan once, in one command; the figures behind docs/benchmarks/gpu.md.
#
#   bash benchmarks/gpu/run.sh OUTDIR          # on a machine with one CUDA GPU
#   bash benchmarks/gpu/run.sh OUTDIR smoke    # the same steps at toy sizes, on CPU (checks the script itself)
#   ONLY="exactness bench-gpu" bash benchmarks/gpu/run.sh OUTDIR   # just those steps
#   BENCH_GPU="--backends cudnn,flash --sdpa-kinds cudnn,flash" ...  # extra bench_gpu.py flags
#   SP_PLAN_COMMIT=abc1234 bash benchmarks/gpu/run.sh OUTDIR   # the commit to record, where the copy has no .git
#
# Steps (each with its own time limit; a failing step is reported and the next runs): the fused-op probe,
# exactness against float64, examples/train_hf_llama.py --check at world 1 in float32 and bfloat16 (NCCL),
# bench_gpu.py, bench_overlap.py, `sp-plan tune` at world 1 of llama3-8b shapes with 2 layers, and that
# profile's prediction of a length and a depth tune did not measure (tune_check.py), then the packed-documents
# bench on the host's CPU cores (masks-cpu). Writes OUTDIR/summary.txt
# and OUTDIR/gpu-run.tgz (every log and JSON file).
set -u
out=${1:?usage: run.sh OUTDIR [smoke]}
mode=${2:-full}
here=$(cd "$(dirname "$0")/../.." && pwd)
gpu=$here/benchmarks/gpu
work=$(mktemp -d /tmp/sp-plan-gpu.XXXX)
mkdir -p "$out"
export PYTHONUNBUFFERED=1
# Wheels the machine lacks (carried in .whl), and the repository importable as sp_plan without an install.
if ls "$here"/.whl/*.whl >/dev/null 2>&1 && ! python3 -c "import pydantic, optuna, sqlalchemy" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$here"/.whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if ! (cd /tmp && python3 -c "import sp_plan") 2>/dev/null; then
    mkdir -p /tmp/pkg && ln -sfn "$here" /tmp/pkg/sp_plan
    export PYTHONPATH=/tmp/pkg${PYTHONPATH:+:$PYTHONPATH}
fi
CLI="python3 -m sp_plan.cli.app"

summary=$work/summary.txt
step() {  # step NAME SECONDS COMMAND...: run it with a time limit, log it, note its exit code and duration
    local name=$1 limit=$2; shift 2
    case " ${ONLY:-$name} " in *" $name "*) ;; *) return 0 ;; esac  # ONLY="a b": run just those steps
    local t0=$SECONDS
    echo "=== $name (limit ${limit}s)"
    timeout --kill-after=10 "$limit" "$@" >"$work/$name.log" 2>&1
    local rc=$?
    printf '%-16s rc %-3s %4ss\n' "$name" "$rc" "$((SECONDS - t0))" | tee -a "$summary"
    tail -n 40 "$work/$name.log"
    cp "$summary" "$out/summary.txt"; tar czf "$out/gpu-run.tgz" -C "$work" .  # kept even if a later step is cut off
}

if [ "$mode" = smoke ]; then
    S="--n 96 --heads 4 --kv-heads 2 --head-dim 32"; SEQS=256,512; MODEL=tiny-llama; TSEQ=1k; CSEQ=2k
    BG="--heads 4 --kv-heads 2 --head-dim 32 --repeats 2 --max-math-seq 256"; OV="--seq 256 --heads 4 --kv-heads 2 --head-dim 32 --repeats 2"
    CHECKS="--check tiny-llama:$CSEQ"; PSEQ=256; EST="--model tiny-llama --seq-len $CSEQ"
else
    S=""; SEQS=1k,2k,4k,8k,16k,32k,64k; MODEL=$gpu/llama3-8b-2l.yaml; TSEQ=16k; CSEQ=32k
    BG="--repeats 3"; OV="--repeats 5"; PSEQ=8192
    CHECKS="--check $gpu/llama3-8b-2l.yaml:32k --check $gpu/llama3-8b-4l.yaml:16k"
    EST="--model $gpu/llama3-8b-4l.yaml --seq-len 16k"
fi

# SP_PLAN_COMMIT names the commit where the copy's git metadata may be older than its files (a tree sent to a
# device machine without its .git); else git's HEAD, with "+changes" when the tree differs from it.
commit=${SP_PLAN_COMMIT:-$(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)}
[ -z "${SP_PLAN_COMMIT:-}" ] && [ -n "$(git -C "$here" status --porcelain --untracked-files=no 2>/dev/null)" ] \
    && commit="$commit+changes"
{ echo "# $(date -u +%FT%TZ) commit $commit"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>/dev/null || echo "no GPU"
  python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version())"
} | tee "$summary"

step discover 120 torchrun --nproc-per-node 1 --master-port 29611 -m sp_plan.cli.app discover -o "$work/cluster.yaml"
[ -f "$work/cluster.yaml" ] || step discover-no-nvml 120 torchrun --nproc-per-node 1 --master-port 29614 \
    -m sp_plan.cli.app discover --no-nvml -o "$work/cluster.yaml"
step plan-tiny 60 $CLI plan --cluster "$work/cluster.yaml" --model tiny-llama --seq-len 2k --no-profile -o "$work/plan-tiny.yaml"
# Correctness first; these three only check, so they share the device.
step exactness 240 python3 "$gpu/exactness.py" $S --json "$work/exactness.json" &
step hf-float32 240 torchrun --nproc-per-node 1 --master-port 29612 "$here/examples/train_hf_llama.py" "$work/plan-tiny.yaml" \
    --check --seq-len 2048 --steps 3 --dtype float32 &
step hf-bfloat16 240 torchrun --nproc-per-node 1 --master-port 29613 "$here/examples/train_hf_llama.py" "$work/plan-tiny.yaml" \
    --check --seq-len 2048 --steps 3 --dtype bfloat16 &
wait
# Timings, one at a time.
step probe-ops 120 python3 "$gpu/probe_ops.py" --seq "$PSEQ" $( [ "$mode" = smoke ] && echo "--heads 4 --kv-heads 2 --head-dim 32 --gqa-seqs 256" )
step bench-gpu 300 python3 "$here/benchmarks/bench_gpu.py" --seqs "$SEQS" $BG ${BENCH_GPU:-} --json "$work/bench_gpu.json"
step bench-overlap 120 python3 "$here/benchmarks/bench_overlap.py" $OV
step tune 200 $CLI tune --cluster "$work/cluster.yaml" --model "$MODEL" --seq-len "$TSEQ" --budget 4 --max-minutes 2 \
    --store "sqlite:///$work/store.db" -o "$work/tuned.yaml"
step tune-check 150 python3 "$gpu/tune_check.py" --cluster "$work/cluster.yaml" --store "sqlite:///$work/store.db" \
    --plan "$work/tuned.yaml" $CHECKS --json "$work/tune_check.json"
step estimate 60 $CLI estimate "$work/tuned.yaml" --cluster "$work/cluster.yaml" --store "sqlite:///$work/store.db" $EST
# The packed-documents bench on the host's CPU cores, a core per gloo rank: with 8 ranks side by side the wall time
# reads the busiest rank, as devices do (docs/benchmarks/masks.md). Needs no GPU; a host with under 9 cores skips it.
if [ "$mode" = smoke ]; then
    MASKS="--world 2 --quick"
else
    MASKS="--world 8 --head-dim 16 --repeats 3 --batches magi-short:16384:key,megatron-dcp:16384:key --single 0"
fi
if [ "$mode" = smoke ] || [ "$(nproc)" -ge 9 ]; then
    step masks-cpu 300 python3 "$here/benchmarks/bench_masks.py" $MASKS --json "$work/masks.json"
fi

cp "$summary" "$out/summary.txt"
tar czf "$out/gpu-run.tgz" -C "$work" .
echo "=== summary"; cat "$summary"
