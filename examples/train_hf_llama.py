"""Train a small Hugging Face Llama sequence-parallel under a plan from sp-plan (CPU gloo or NCCL on GPUs).

    torchrun --nproc-per-node 4 examples/train_hf_llama.py [plan.yaml ...] [--steps 3] [--seq-len 128] [--check]
                                                           [--dtype float32|bfloat16] [--documents FILE|NAME]

Several plan files run one after another in the same launch (each checked on its own with ``--check``).

Without a plan file, rank 0 runs the search of ``sp-plan plan --cluster cpu-local --model tiny-llama
--seq-len N --no-profile`` on as many ranks as the launch has, restricted to what the integration runs
(tp = pp = 1), and broadcasts the winner. The Llama is built from the plan's model sizes (``--layers`` of
them) by transformers' LlamaConfig: nothing is downloaded.

Loss reduction: every rank holds the whole global batch of token ids (same seed), keeps its data-parallel
rows and its tokens (``shard_inputs``: labels shifted on the full sequence, then sharded), sums its
tokens' cross entropy and divides by the number of loss tokens of the whole global batch (no
communication needed). The sum of the ranks' losses is then exactly the single-process mean, and
summing the gradients over all ranks (``all_reduce_grads``) gives its exact gradient; every rank then
takes the same AdamW step on the same replicated weights. ZeRO and checkpointing fields of the plan
are not applied by this example.

``--documents`` packs every sequence with documents drawn from a distribution (a file of lengths or a name of
profiles/documents.yaml; the plan's own documents if it has some and the flag is absent), seeded by ``--seed``
(``planner.documents.workload_packs``): position ids restart at each document (transformers' padding-free
convention, which ``shard_inputs`` turns into ``cu_seqlens``) and each document's first token gets label -100,
as transformers' ``DataCollatorWithFlattening`` does, so no token predicts across documents.

``--check`` reruns the same steps on rank 0 in one process (transformers' sdpa attention and its own
loss with ``labels``; without a cache, so it reads packed documents from the position ids) and asserts that the loss and the gradient norm of every step agree: to 1e-5 (relative)
in float32, to 2e-2 in bfloat16 (weights and activations in that dtype; the two runs round in
different places, and bfloat16 keeps 8 bits of mantissa: 2e-2 is about five of its units in the last place).
"""
from __future__ import annotations

import argparse
import datetime
import math
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from sp_plan.integrations.transformers import (IGNORE_INDEX, all_reduce_grads, check_plan, count_loss_tokens, register,
                                               shard_inputs)
from sp_plan.planner import Plan, PlanError
from sp_plan.runtime import init

#: relative agreement of --check's loss and gradient norm with one process, by --dtype
TOLERANCE = {"float32": 1e-5, "bfloat16": 2e-2}
#: float16 weights train only with float32 master weights and loss scaling, which this example does not do (AdamW
#: on float16 weights drifts apart between two runs that round differently, and its eps of 1e-8 rounds to 0)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def positive(text: str) -> int:
    """A whole number >= 1 (argparse's type: anything else is its one-line usage error)."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return n


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("plan", nargs="*", help="plan files from `sp-plan plan -o`, run in turn (default: plan now on "
                   "--cluster)")
    p.add_argument("--cluster", default="cpu-local", help="cluster preset or file for the search (no plan file); "
                   "a preset takes the launched ranks")
    p.add_argument("--model", default="tiny-llama", help="model preset or file for the search and the Llama sizes")
    p.add_argument("--seq-len", type=positive, default=128, help="tokens per sequence")
    p.add_argument("--batch", type=positive, default=1, help="global batch (sequences per step)")
    p.add_argument("--layers", type=positive, default=2, help="decoder layers of the Llama (the plan's model has more)")
    p.add_argument("--steps", type=positive, default=3)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0, help="seed of the weights, the token ids and the packs")
    p.add_argument("--documents", help="pack sequences with documents: a file of lengths or a named distribution")
    p.add_argument("--check", action="store_true", help="rerun in one process; loss and grad norm agree (TOLERANCE)")
    p.add_argument("--dtype", choices=list(DTYPES), default="float32", help="weights and activations (default float32)")
    return p.parse_args(argv)


def search_cluster(name: str, world: int):
    """The cluster the search plans for: a preset with as many ranks as the launch has (whole nodes of it, or one
    node of ``world`` ranks where the launch is smaller than a node: 2 of cpu-local's 4), a cluster file as it is."""
    from sp_plan.profiles import cluster_presets, load_cluster, preset_cluster  # noqa: PLC0415

    cluster = load_cluster(name)
    if cluster.world_size == world or name not in cluster_presets():
        return cluster
    per_node = cluster.devices_per_node
    return load_cluster(name, world // per_node) if world % per_node == 0 else preset_cluster(name, 1, world)


def search(args, world: int) -> Plan:
    """The fastest plan the integration runs: `sp-plan plan`'s grid search with tp = 1, then pp = 1."""
    from sp_plan.planner.model import Workload
    from sp_plan.pipeline import plan as ranked_plans
    from sp_plan.planner.search import Space
    from sp_plan.profiles import load_model
    from sp_plan.profiles.documents import resolve_documents

    cluster, model = search_cluster(args.cluster, world), load_model(args.model)
    docs = resolve_documents(args.documents) if args.documents else None
    work = Workload(seq_len=args.seq_len, batch=args.batch, causal=True, training=True, documents=docs,
                    seed=None if docs is None else args.seed)
    plans = ranked_plans(cluster, model, work, top_k=50, space=Space(cluster.world_size, model, work, tp_max=1),
                         profile=False).flat()
    refused = []
    for plan in plans:
        try:
            check_plan(plan)
            return plan
        except PlanError as e:
            refused.append(f"{plan.summary()} ({e.field}: {e.problem})")
    said = "; ".join(refused[:2]) + (f"; and {len(refused) - 2} more" if len(refused) > 2 else "")
    raise PlanError("plan", f"none of the {len(plans)} fastest plans of {world} ranks and {args.seq_len} tokens runs "
                    f"here: {said or 'the search found none'}", "launch a world whose size divides the model's heads "
                    "and the tokens, or pass a plan file with tp 1 and pp 1")


def get_plans(args, rank: int) -> list[Plan]:
    """The plan files, or rank 0's search broadcast to every rank."""
    if args.plan:
        return [Plan.load(p) for p in args.plan]
    box = [None]
    if rank == 0:
        try:
            box = [("plan", search(args, dist.get_world_size()).model_dump(mode="json"))]
        except PlanError as e:  # every rank refuses with rank 0's error, none waits on a broadcast that never comes
            box = [("error", (e.field, e.problem, e.fix))]
    dist.broadcast_object_list(box, src=0)
    kind, value = box[0]
    if kind == "error":
        raise PlanError(*value)
    return [Plan.model_validate(value)]


def packs(plan: Plan, args) -> list | None:
    """cu_seqlens of every step's sequences (batch x steps, seeded), or None without documents."""
    from sp_plan.planner.documents import workload_packs
    from sp_plan.planner.model import Workload
    from sp_plan.profiles.documents import resolve_documents

    if args.documents:
        docs = resolve_documents(args.documents)
    else:
        docs = plan.workload.documents if plan.workload else None
    if docs is None:
        return None
    work = Workload(seq_len=args.seq_len, batch=args.batch, documents=docs, seed=args.seed)
    return workload_packs(work, args.batch * args.steps)


def step_inputs(cfg, args, step: int, cus: list | None, device):
    """Step ``step``'s token ids, position ids (None unpacked) and labels of the whole global batch."""
    ids = global_batch(cfg, args, step, device)
    if cus is None:
        return ids, None, ids
    rows = cus[step * args.batch:(step + 1) * args.batch]
    pos = torch.stack([torch.cat([torch.arange(n) for n in np.diff(cu).tolist()]) for cu in rows]).to(device)
    labels = ids.clone()
    labels[pos == 0] = IGNORE_INDEX  # a document's first token is no prediction of the one before
    return ids, pos, labels


def llama_config(plan: Plan, args):
    """A LlamaConfig of the plan's model sizes (or the --model preset's) with --layers layers."""
    from transformers import LlamaConfig

    from sp_plan.profiles import load_model

    m = plan.model or load_model(args.model)
    return LlamaConfig(hidden_size=m.hidden, intermediate_size=m.ffn_hidden, num_attention_heads=m.heads,
                       num_key_value_heads=m.kv_heads, head_dim=m.head_dim, num_hidden_layers=args.layers,
                       vocab_size=m.vocab, max_position_embeddings=max(args.seq_len, 128), attention_dropout=0.0)


def build_model(cfg, attn: str, seed: int, device, dtype: torch.dtype = torch.float32):
    """The same initial weights in every process: seeded construction (in float32, then cast)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation=attn).to(device=device, dtype=dtype)


def global_batch(cfg, args, step: int, device) -> torch.Tensor:
    """Step ``step``'s token ids of the whole global batch (identical on every rank)."""
    g = torch.Generator().manual_seed(args.seed * 1000 + step)
    return torch.randint(0, cfg.vocab_size, (args.batch, args.seq_len), generator=g).to(device)


def grad_norm(model) -> float:
    return torch.linalg.vector_norm(torch.cat([p.grad.reshape(-1).float() for p in model.parameters()])).item()


def train(ctx, cfg, args, device, cus=None) -> list[tuple[float, float]]:
    """Sequence-parallel steps (packed with ``cus``); returns (loss, grad norm) per step, the same on every rank."""
    model = build_model(cfg, register(ctx), args.seed, device, DTYPES[args.dtype])
    opt = optimizer(model, args)
    dp, dp_rank = ctx.plan.degrees["dp"], ctx.layout.coords(ctx.rank).get("dp", 0)
    if args.batch % dp:
        raise PlanError("--batch", f"{args.batch} sequences do not split over dp {dp}", f"pass a multiple of {dp}")
    history = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        ids, positions, targets = step_inputs(cfg, args, step, cus, device)
        mine = slice(dp_rank * (args.batch // dp), (dp_rank + 1) * (args.batch // dp))  # this data rank's sequences
        x, pos, labels = shard_inputs(ctx, ids[mine], targets[mine], None if positions is None else positions[mine])
        logits = model(input_ids=x, position_ids=pos).logits
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="sum") / count_loss_tokens(
            targets)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        all_reduce_grads(ctx, model)
        total = loss.detach().clone()
        dist.all_reduce(total)
        gn = grad_norm(model)
        opt.step()
        history.append((total.item(), gn))
        if ctx.rank == 0:
            print(f"step {step + 1}/{args.steps}  loss {total.item():.6f}  grad-norm {gn:.6f}  "
                  f"({time.perf_counter() - t0:.2f} s)", flush=True)
    return history


def reference(cfg, args, device, cus=None) -> list[tuple[float, float]]:
    """The same steps in one process: transformers' sdpa attention and its own causal-LM loss."""
    model = build_model(cfg, "sdpa", args.seed, device, DTYPES[args.dtype])
    opt = optimizer(model, args)
    history = []
    for step in range(args.steps):
        ids, pos, labels = step_inputs(cfg, args, step, cus, device)
        opt.zero_grad(set_to_none=False)
        loss = model(input_ids=ids, position_ids=pos, labels=labels, use_cache=False).loss
        loss.backward()
        history.append((loss.item(), grad_norm(model)))
        opt.step()
    return history


def optimizer(model, args) -> torch.optim.AdamW:
    """AdamW on the model's weights (float32 or bfloat16: ``DTYPES``)."""
    return torch.optim.AdamW(model.parameters(), lr=args.lr)


def check(got, want, tolerance: float = TOLERANCE["float32"]) -> bool:
    """Print each step's loss and grad norm against one process; True if all agree to ``tolerance`` (relative)."""
    ok = True
    for step, ((l, g), (lr, gr)) in enumerate(zip(got, want), 1):
        dl, dg = abs(l - lr) / max(abs(lr), 1.0), abs(g - gr) / max(abs(gr), 1.0)
        finite = all(math.isfinite(x) for x in (l, g, lr, gr))
        good = finite and dl <= tolerance and dg <= tolerance
        ok &= good
        print(f"check step {step}: loss {l:.6f} vs {lr:.6f} (rel diff {dl:.1e}), grad-norm {g:.6f} vs {gr:.6f} "
              f"(rel diff {dg:.1e}) {'ok' if good else 'MISMATCH' if finite else 'NOT FINITE'}", flush=True)
    return ok


def run_plan(plan: Plan, args, rank: int, device) -> bool:
    """Train under one plan (and with --check compare with one process); True unless the check failed."""
    check_plan(plan)
    ctx = init(plan)
    cfg = llama_config(plan, args)
    cus = packs(plan, args)
    if rank == 0:
        docs = "" if cus is None else f", {sum(len(c) - 1 for c in cus)} packed documents"
        print(f"plan: {plan.summary()} on {dist.get_world_size()} ranks ({dist.get_backend()}); Llama "
              f"{cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, {cfg.num_attention_heads} heads, "
              f"{cfg.num_key_value_heads} KV heads, vocab {cfg.vocab_size}; {args.batch} x {args.seq_len} tokens"
              f"{docs}, {args.dtype}", flush=True)
    history = train(ctx, cfg, args, device, cus)
    ok = True
    if args.check and rank == 0:
        ok = check(history, reference(cfg, args, device, cus), TOLERANCE[args.dtype])
    flag = torch.tensor([int(ok)], device=device)
    dist.broadcast(flag, src=0)
    return bool(flag.item())


def main(argv=None) -> int:
    args = parse_args(argv)
    if "RANK" not in os.environ:
        print("train_hf_llama: launch with torchrun, e.g. torchrun --nproc-per-node 4 examples/train_hf_llama.py",
              file=sys.stderr)
        return 2
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # float32 to compare
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=300))
    rank = dist.get_rank()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    try:
        ok = all([run_plan(plan, args, rank, device) for plan in get_plans(args, rank)])
    except PlanError as e:  # on every rank that meets it: torchrun stops the others when the first one exits
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    finally:
        dist.destroy_process_group()
    if rank == 0:
        print("check passed: loss and grad norm agree with one process" if args.check and ok else
              "check FAILED" if args.check else "done", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter finalization: gloo's worker threads can still hold tensors then and abort the process
    # ("terminate called without an active exception", seen here once in ~20 runs; pytorch/pytorch#179291).
    os._exit(code)
