"""Discovery and link measurement under torchrun: the torch.distributed half of `sp-plan discover/profile links`.

Every rank says where it runs (torchrun's node rank ``GROUP_RANK`` and the hostname); one rank per node
describes its host; ``all_gather_object`` gives every rank all reports, and every rank builds the same
Cluster. ``measure`` then times send/recv (one way and both ways at once), all-gather,
reduce-scatter and all-to-all within a node and across nodes over several sizes; the fits and the
calibrated capacities are ``calibrate``'s (this package). Every wait has a deadline; a failed
measurement is recorded, not fatal. It loads torch, so the package's ``__init__`` does not import it: only a
measuring command pays for torch.
"""
from __future__ import annotations

import datetime
import os
import socket
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from sp_plan.planner.cluster import Cluster
from sp_plan.planner.engine import LinkEngine
from sp_plan.planner.errors import PlanError
from sp_plan.runtime.spawn import fork_safe_c10d
from .build import build_cluster
from .calibrate import Sample, calibrate
from .host import describe_host, visible_gpus
from .report import HostReport, RankInfo
from .specs import model_name

Progress = Callable[[int, int, str], None]


def under_torchrun(env=None) -> bool:
    """True when torchrun (or a compatible launcher) set this process's rank and world."""
    env = os.environ if env is None else env
    return all(k in env for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"))


def rank_info(env=None) -> RankInfo:
    """This rank's identity from torchrun's environment (GROUP_RANK is the node rank)."""
    env = os.environ if env is None else env
    try:
        rank, world = int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1))
        local, local_world = int(env.get("LOCAL_RANK", 0)), int(env.get("LOCAL_WORLD_SIZE", 1))
        node = int(env.get("GROUP_RANK", env.get("NODE_RANK", 0)))
    except ValueError as e:
        raise PlanError("environment", f"torchrun variables are not integers ({e})", "launch with torchrun") from None
    if not (0 <= rank < world and 0 <= local < local_world and node >= 0):
        raise PlanError("environment", f"RANK {rank} of WORLD_SIZE {world}, LOCAL_RANK {local} of LOCAL_WORLD_SIZE "
                        f"{local_world}, node {node}: not a rank of that world", "launch with torchrun") from None
    return RankInfo(rank=rank, world_size=world, local_rank=local, local_world_size=local_world, node_rank=node,
                    hostname=socket.gethostname())


def use_cuda() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def init_world(timeout: float) -> bool:
    """Join torchrun's world (gloo, plus NCCL for CUDA tensors); False if it was already initialized."""
    if dist.is_initialized():
        return False
    fork_safe_c10d()  # tune forks a child world per candidate
    cuda = use_cuda()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=timeout))
    return True


def finish(owned: bool) -> None:
    if owned and dist.is_initialized():
        dist.destroy_process_group()


def gather_objects(obj) -> list:
    """Every rank's ``obj``, in rank order, on every rank (all_gather_object)."""
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def cuda_identity() -> dict | None:
    """Name, memory, UUID and PCI bus id of this rank's CUDA device (None without CUDA)."""
    if not use_cuda():
        return None
    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    ids = [getattr(p, a, None) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
    bus = f"{ids[0]:04x}:{ids[1]:02x}:{ids[2]:02x}.0" if all(isinstance(x, int) for x in ids) else ""
    uuid = str(getattr(p, "uuid", "") or "")
    return {"name": p.name, "memory": float(p.total_memory), "uuid": uuid, "bus": bus}


def _match_gpu(h: HostReport, cuda: dict, fallback: int | None) -> int | None:
    """The physical GPU a rank drives: by PCI bus id, else UUID, else CUDA_VISIBLE_DEVICES order."""
    for g in h.gpus:
        if cuda.get("bus") and g.pci_bus == cuda["bus"]:
            return g.index
        if cuda.get("uuid") and g.uuid and g.uuid.removeprefix("GPU-") == cuda["uuid"].removeprefix("GPU-"):
            return g.index
    return fallback


def _fill_from_cuda(h: HostReport, gpu: int, cuda: dict) -> None:
    """Where NVML and nvidia-smi were missing, CUDA still names the GPU and its memory."""
    g = next((x for x in h.gpus if x.index == gpu), None)
    if g is not None and not g.name:
        g.name, g.memory_bytes = cuda["name"], cuda["memory"]
        g.model = model_name(g.name, g.memory_bytes)
        note = "GPU names and memory from torch.cuda (NVML and nvidia-smi --query-gpu missing)"
        if note not in h.warnings:
            h.warnings.append(note)


def gather_hosts(describe: Callable[[RankInfo], HostReport] | None = None) -> list[HostReport]:
    """Every node's HostReport with its ranks, on every rank (nodes keyed by node rank and hostname)."""
    me = rank_info()
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    idents = gather_objects((me.model_dump(), cvd, cuda_identity()))
    infos = [RankInfo.model_validate(i) for i, _, _ in idents]
    keys = sorted({(i.node_rank, i.hostname) for i in infos})
    first = {k: min(i.rank for i in infos if (i.node_rank, i.hostname) == k) for k in keys}
    mine = (me.node_rank, me.hostname)
    report = None
    if first[mine] == me.rank:
        try:
            rep = (describe or (lambda r: describe_host(node_rank=r.node_rank)))(me)
            report = rep.model_dump(mode="json")
        except Exception as e:  # noqa: BLE001 - a host that cannot be described still joins, as a stub
            report = {"error": f"{type(e).__name__}: {e}"}
    reports = gather_objects(report)
    hosts = []
    for k in keys:
        raw = reports[first[k]]
        if raw is None or "error" in raw:
            why = raw["error"] if raw else "no report"
            raise PlanError("discover", f"host {k[1]} (node rank {k[0]}) could not be described: {why}",
                            "run `sp-plan discover` alone on that host to see why")
        h = HostReport.model_validate(raw)
        h.node_rank = k[0]
        h.hostname = k[1]
        ranks = sorted((i for i in infos if (i.node_rank, i.hostname) == k), key=lambda i: i.local_rank)
        for i in ranks:
            _, cv, cuda = idents[i.rank]
            if cuda:
                vis = visible_gpus(h, {} if cv is None else {"CUDA_VISIBLE_DEVICES": cv})
                i.gpu = _match_gpu(h, cuda, vis[i.local_rank % len(vis)] if vis else None)
                if i.gpu is not None:
                    _fill_from_cuda(h, i.gpu, cuda)
        h.ranks = ranks
        hosts.append(h)
    return hosts


def discover_world(timeout: float = 120.0, describe=None) -> tuple[Cluster, list[HostReport]]:
    """The Cluster of the running torchrun world (the same on every rank) and the host reports."""
    hosts = gather_hosts(describe)
    return build_cluster(hosts), hosts


# ---- measurements
@dataclass
class Probe:
    """One measurement: ``op`` on concurrent ``groups`` of world ranks, priced as ``link_class``."""

    link_class: str
    op: str
    groups: list[list[int]]
    handles: list | None = None  # process groups (collectives), in groups' order

    @property
    def group_size(self) -> int:
        return len(self.groups[0])


def plan_probes(cluster: Cluster, hosts: list[HostReport]) -> tuple[list[Probe], dict[str, tuple[int, int]]]:
    """Which pairs and groups to time: within node 0 and from node 0 to node 1, collectives per node and per rail."""
    nodes = [[r.rank for r in h.ranks] for h in hosts]
    probes: list[Probe] = []
    pairs: dict[str, tuple[int, int]] = {}
    if len(nodes[0]) >= 2:
        a, b = nodes[0][0], nodes[0][1]
        cls = f"intra:{_bottleneck_kind(cluster, a, b)}"
        pairs[cls] = (a, b)
        probes += [Probe(cls, "p2p", [[a, b]]), Probe(cls, "p2p_bidir", [[a, b]])]
        groups = [n for n in nodes if len(n) == len(nodes[0])]
        probes += [Probe(cls, op, groups) for op in ("all_gather", "reduce_scatter", "all_to_all")]
    if len(nodes) >= 2:
        a, b = nodes[0][0], nodes[1][0]
        cls = f"inter:{cluster.network if cluster.network != 'none' else _bottleneck_kind(cluster, a, b)}"
        pairs[cls] = (a, b)
        probes += [Probe(cls, "p2p", [[a, b]]), Probe(cls, "p2p_bidir", [[a, b]])]
        per = min(len(n) for n in nodes)
        rails = [[n[r] for n in nodes] for r in range(per)]
        probes += [Probe(cls, op, rails) for op in ("all_gather", "reduce_scatter", "all_to_all")]
    return probes, pairs


def _bottleneck_kind(cluster: Cluster, a: int, b: int) -> str:
    eng = LinkEngine(cluster)
    edges, _ = eng.route(a, b)
    return min((eng.local.edges[e] for e in edges), key=lambda x: x["capacity"])["kind"] if edges else "local"


#: the point-to-point probes: one way, and both ways at once
P2P_OPS = ("p2p", "p2p_bidir")


def _wait(works, timeout: datetime.timedelta) -> None:
    for w in works if isinstance(works, list) else [works]:
        if w is not None:
            w.wait(timeout)


def _run_op(p: Probe, rank: int, nbytes: int, dev: torch.device, timeout: datetime.timedelta, bufs: dict) -> None:
    """One operation of probe ``p`` as seen by ``rank`` (a member of one of its groups)."""
    g_idx = next(i for i, g in enumerate(p.groups) if rank in g)
    group = p.groups[g_idx]
    if p.op in P2P_OPS:
        peer = group[1] if rank == group[0] else group[0]
        send, recv = bufs["a"], bufs["b"]
        if p.op == "p2p":
            w = dist.isend(send, peer) if rank == group[0] else dist.irecv(recv, peer)
            _wait(w, timeout)
        else:
            ops = [dist.P2POp(dist.isend, send, peer), dist.P2POp(dist.irecv, recv, peer)]
            _wait(dist.batch_isend_irecv(ops), timeout)
        return
    pg = p.handles[g_idx]
    big, small = bufs["a"], bufs["s"]
    if p.op == "all_gather":
        fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        _wait(fn(big, small, group=pg, async_op=True), timeout)
    elif p.op == "reduce_scatter":
        fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        _wait(fn(small, big, group=pg, async_op=True), timeout)
    elif p.op == "all_to_all":
        _wait(dist.all_to_all_single(bufs["b"], big, group=pg, async_op=True), timeout)


def _buffers(p: Probe, nbytes: int, dev: torch.device) -> tuple[dict, int]:
    """Float32 buffers for ``nbytes`` (rounded to whole elements per rank); returns them and the bytes used."""
    n = p.group_size
    per = max(1, nbytes // (4 * n))
    numel = per * n
    a = torch.ones(numel, dtype=torch.float32, device=dev)
    return {"a": a, "b": torch.empty_like(a), "s": torch.ones(per, dtype=torch.float32, device=dev)}, numel * 4


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _timed(p: Probe, rank: int, nbytes: int, reps: int, dev, timeout, bufs, batches: int = 1) -> float:
    """Seconds per operation: ``reps`` back-to-back after the group's barrier, best of ``batches`` such runs. A send
    completes once its bytes are in the transport's buffers, and a receiver woken late after the barrier finds bytes
    already there: a point-to-point run ends at a second barrier, after the last receive, so the sender's clock holds
    the whole transfer (the slowest rank's reading is kept)."""
    pg = p.handles[next(i for i, g in enumerate(p.groups) if rank in g)]
    best = float("inf")
    for _ in range(batches):
        _wait(dist.barrier(group=pg, async_op=True), timeout)
        _sync(dev)
        t0 = time.perf_counter()
        for _ in range(reps):
            _run_op(p, rank, nbytes, dev, timeout, bufs)
        if p.op in P2P_OPS:
            _wait(dist.barrier(group=pg, async_op=True), timeout)
        _sync(dev)
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def _agree(values: list[float], dev: torch.device) -> list[float]:
    """Element-wise max over the world (every rank calls it)."""
    t = torch.tensor(values, dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def measure(cluster: Cluster, hosts: list[HostReport], sizes: list[int], timeout: float = 60.0,
            progress: Progress | None = None, target_s: float = 0.05, min_reps: int = 2, max_reps: int = 20,
            batches: int = 2) -> tuple[list[Sample], dict[str, tuple[int, int]], dict]:
    """Time every probe at every size on all ranks (collective); every rank returns the same samples.

    A point is the mean of ``min_reps``..``max_reps`` back-to-back operations (about ``target_s`` of them),
    best of ``batches`` runs, on the slowest rank: sustained rate, robust to a busy host.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", torch.cuda.current_device()) if use_cuda() else torch.device("cpu")
    wait = datetime.timedelta(seconds=timeout)
    probes, pairs = plan_probes(cluster, hosts)
    for p in probes:  # every rank creates every group, in the same order
        p.handles = [dist.new_group(g, timeout=wait) for g in p.groups]
    samples: list[Sample] = []
    total, done, broken = len(probes) * len(sizes), 0, ""
    for p in probes:
        member = any(rank in g for g in p.groups)
        for nbytes in sizes:
            label = f"{p.link_class} {p.op} {_human(nbytes)}"
            if broken:
                samples.append(Sample(p.link_class, p.op, p.group_size, nbytes, None, f"skipped: {broken}"))
                done += 1
                continue
            err, secs, used = "", 0.0, nbytes
            try:
                bufs, used = _buffers(p, nbytes, dev)
                t1 = _timed(p, rank, used, 1, dev, wait, bufs) if member else 0.0  # warm-up, also sizes the loop
            except Exception as e:  # noqa: BLE001 - recorded, not fatal
                err, t1 = f"{type(e).__name__}: {e}".splitlines()[0][:300], 0.0
            try:
                t1, bad = _agree([t1, 1.0 if err else 0.0], dev)
                if not bad:
                    reps = max(min_reps, min(max_reps, int(target_s / max(t1, 1e-6))))
                    try:
                        secs = _timed(p, rank, used, reps, dev, wait, bufs, batches) if member else 0.0
                    except Exception as e:  # noqa: BLE001
                        err = f"{type(e).__name__}: {e}".splitlines()[0][:300]
                    secs, bad = _agree([secs, 1.0 if err else 0.0], dev)
                if bad:
                    errs = dict.fromkeys(f"rank {r}: {e}" for r, e in enumerate(gather_objects(err)) if e)
                    err = "; ".join(errs) or "failed on another rank"
            except Exception as e:  # noqa: BLE001 - the world itself is broken: stop measuring, keep what we have
                broken = f"world broken after {label}: {type(e).__name__}: {e}".splitlines()[0][:300]
                err = broken
            samples.append(Sample(p.link_class, p.op, p.group_size, used, None if err else secs, err))
            done += 1
            if progress:
                progress(done, total, label)
    if not broken:  # the probes' groups end here: left alive, their gloo transports kept stalling ranks afterwards
        dist.barrier()
        for p in probes:
            for pg in p.handles:
                if pg is not None and pg != dist.GroupMember.NON_GROUP_MEMBER:
                    dist.destroy_process_group(pg)
    meta = {"measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "backend": dist.get_backend(), "device": dev.type, "world_size": world, "nodes": len(hosts),
            "sizes": list(sizes), "statistic": f"mean of {min_reps}-{max_reps} back-to-back operations, best of {batches} runs, slowest rank"}
    return samples, pairs, meta


def profile_links(cluster: Cluster, hosts: list[HostReport], sizes: list[int], timeout: float = 60.0,
                  progress: Progress | None = None) -> tuple[Cluster, list[Sample]]:
    """Measure, fit and write back: the calibrated cluster (same on every rank) and the raw samples."""
    check_world(cluster, hosts)
    samples, pairs, meta = measure(cluster, hosts, sizes, timeout, progress)
    return calibrate(cluster, samples, pairs, meta), samples


def check_world(cluster: Cluster, hosts: list[HostReport]) -> None:
    """The cluster file must describe the running world: same node count and ranks per node."""
    got = [len(h.ranks) for h in hosts]
    want = [len(cluster.node_types[t].devices) for t in cluster.nodes]
    if got != want:
        raise PlanError("cluster", f"the cluster has {want} devices per node but the running world has {got} ranks "
                                     "per node", "run `sp-plan discover` under the same torchrun, or drop --cluster")


def _human(n: int) -> str:
    for unit, size in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n >= size:
            return f"{n / size:g}{unit}"
    return f"{n}B"
