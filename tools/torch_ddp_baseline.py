#!/usr/bin/env python3
"""PyTorch DistributedDataParallel over gloo on the CPU, beside `mpirun -np N regen train`:
the same models (tools/torch_models.py), the same per-rank batch, SGD with momentum 0.9, one
process per rank with --threads threads each, DDP's default buckets (25 MiB, the first 1 MiB).

The script starts the ranks itself (python3 tools/torch_ddp_baseline.py --ranks 2 ...): each is a
process of this script with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, and with
tools/heap_peak.c in LD_PRELOAD (built as tools/torch_baseline.py builds it), so that each rank's
peak heap bytes over the timed steps are measured as torch_baseline.py measures one process's
(PyTorch's CPU allocator keeps no statistics; see there for what the heap counts). Each rank runs
--warmup steps, then --steps timed steps (wall time of zero_grad, forward, backward with DDP's
reduction, optimizer step); rank 0 gathers every rank's figures and prints them, and with --csv
writes one row per rank: model, batch, ranks, rank, threads, step_s (median), step_min_s,
samples_per_s (the global batch over the median step), peak_bytes, live_before_bytes, and DDP's
own measurements of its last sampled iteration (avg_backward_compute_time,
avg_backward_comm_time, avg_backward_compute_comm_overlap_time, in ns, from
model._get_ddp_logging_data(), when this PyTorch records them; empty otherwise).

--shard names what each rank keeps, as regen's flag does, with PyTorch's counterpart of each:
none (DDP), optimizer (DDP with torch.distributed.optim.ZeroRedundancyOptimizer: ZeRO-1),
gradients (FSDP2's fully_shard on every residual block / layer and the root, with
reshard_after_forward=False: parameters stay whole from forward to backward, gradients and
optimizer state sharded, as ZeRO-2 / FSDP's SHARD_GRAD_OP) and parameters (fully_shard with
reshard_after_forward=True: ZeRO-3 / FULL_SHARD). FSDP2 needs PyTorch 2.6 or later; the CSV's
shard column says which ran (DDP's logging columns stay empty under FSDP).

Baseline only: run it with a virtual environment's python holding PyTorch from PyPI, outside
regen's build (docs/results.md, "Data parallelism"):
  VENV/bin/python tools/torch_ddp_baseline.py --ranks 2 --threads 1 \
      --model resnet50 --batch 8 --image-size 128 --shard parameters --csv fsdp.csv
"""
import argparse
import csv
import os
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(a):
    """Starts the ranks (this script in worker mode) and returns their exit status."""
    from torch_baseline import build_heap_lib  # noqa: E402

    lib = None if a.no_heap else build_heap_lib(None)
    port = str(free_port())
    procs = []
    for r in range(a.ranks):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(a.ranks), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=port, OMP_NUM_THREADS=str(a.threads))
        if lib:
            env["LD_PRELOAD"] = lib + (":" + env["LD_PRELOAD"] if env.get("LD_PRELOAD") else "")
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker"] +
                                      sys.argv[1:], env=env))
    status = 0
    for p in procs:
        status = status or p.wait()
    return status


def worker(a):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch_baseline import build, preloaded_heap_counter
    from torch_models import lm_loss

    rank, ranks = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", rank=rank, world_size=ranks)
    heap = preloaded_heap_counter()
    torch.manual_seed(0)  # the same initial model on every rank (DDP broadcasts rank 0's anyway)
    model, family = build(a.model, a.image_size, a.seq_len, a.dropout)
    model = model.train()
    if a.shard in ("none", "optimizer"):
        model = DDP(model, bucket_cap_mb=a.bucket_mb)
    else:
        from torch.distributed.fsdp import fully_shard
        # Every residual block / layer is its own FSDP unit (gathered and freed on its own), then
        # the root (the stem, embeddings, head).
        blocks = [m for m in model.modules()
                  if type(m).__name__ in ("BasicBlock", "Bottleneck", "Block")
                  or isinstance(m, torch.nn.TransformerEncoderLayer)]
        reshard = a.shard == "parameters"
        for m in blocks:
            fully_shard(m, reshard_after_forward=reshard)
        fully_shard(model, reshard_after_forward=reshard)
    if a.shard == "optimizer":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD,
                                      lr=a.lr, momentum=0.9)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    torch.manual_seed(1 + rank)  # each rank its own samples
    if family == "resnet":
        x = torch.randn(a.batch, 3, a.image_size, a.image_size)
        y = torch.randint(0, 1000, (a.batch,))
        loss_fn = torch.nn.functional.cross_entropy
    elif family == "gpt2":
        from torch_baseline import GPT2S
        vocab = GPT2S[a.model][0]
        x = torch.randint(0, vocab, (a.batch, a.seq_len))
        y = torch.randint(0, vocab, (a.batch, a.seq_len))

        def loss_fn(logits, targets):
            return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     targets.reshape(-1))
    else:
        x = torch.randint(0, 30000, (a.batch, a.seq_len))
        y = torch.randint(0, 30000, (a.batch, a.seq_len))
        loss_fn = lm_loss

    def step():
        opt.zero_grad(set_to_none=False)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(a.warmup):
        step()
    dist.barrier()
    live_before = heap.current() if heap else None
    if heap:
        heap.reset_peak()
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    peak = heap.peak() if heap else None
    keys = ("avg_backward_compute_time", "avg_backward_comm_time",
            "avg_backward_compute_comm_overlap_time")
    ddp_log = {k: "" for k in keys}  # the same columns in every row, DDP's or FSDP's
    try:
        if a.shard not in ("none", "optimizer"):
            raise AttributeError("FSDP keeps no DDP logging data")
        data = model._get_ddp_logging_data()
        for k in keys:
            ddp_log[k] = data.get(k, "")
    except Exception:  # noqa: BLE001 (older or newer PyTorch: no such data)
        pass
    mine = dict(model=a.model, batch=a.batch, ranks=ranks, rank=rank, threads=a.threads,
                shard=a.shard,
                step_s=statistics.median(times), step_min_s=min(times),
                samples_per_s=a.batch * ranks / statistics.median(times),
                peak_bytes=peak if peak is not None else "",
                live_before_bytes=live_before if live_before is not None else "",
                torch=torch.__version__, **ddp_log)
    rows = [None] * ranks
    dist.all_gather_object(rows, mine)
    if rank == 0:
        for r in rows:
            print(f"{'ddp' if a.shard in ('none', 'optimizer') else 'fsdp'} gloo: " + ", ".join(f"{k}={v}" for k, v in r.items()), flush=True)
        if a.csv:
            new = not os.path.exists(a.csv)
            with open(a.csv, "a", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
                if new:
                    w.writeheader()
                w.writerows(rows)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="threads per rank")
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch", type=int, default=8, help="per rank")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--bucket-mb", type=float, default=25)
    p.add_argument("--shard", choices=["none", "optimizer", "gradients", "parameters"],
                   default="none", help="what each rank keeps (see above)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--csv", default="")
    p.add_argument("--no-heap", action="store_true", help="times only")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        worker(a)
    else:
        sys.exit(launch(a))


if __name__ == "__main__":
    main()
