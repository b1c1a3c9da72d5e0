#!/usr/bin/env python3
"""PyTorch baselines beside regen, on the same models, batches and math mode.

For each model and batch size: the median training-step time (forward, backward, SGD step with
momentum 0.9) after warm-up and the peak memory, in up to three modes:
  eager        plain PyTorch
  checkpoint   torch.utils.checkpoint (non-reentrant) around every residual block / encoder layer
  compile      torch.compile with torch._functorch.config.activation_memory_budget (PyTorch 2.4+)
Peak memory is torch.cuda.max_memory_allocated on CUDA (the same definition as regen's peak
allocated bytes); on the CPU PyTorch has no allocator statistics, so only times are reported.

Examples:
  /usr/bin/python3 tools/torch_baseline.py --device cpu --threads 2 --model resnet152 --batches 4 \
      --image-size 224 --modes eager
  python3 tools/torch_baseline.py --device cuda --model transformer --batches 32,64,128,256 \
      --modes eager,checkpoint,compile --math fp32 --csv torch_transformer.csv
"""
import argparse
import csv
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_models import RESNETS, ResNet, TransformerLM, lm_loss  # noqa: E402


def build(name, image_size, seq_len, dropout):
    if name in RESNETS:
        blocks, bottleneck = RESNETS[name]
        return ResNet(blocks, 64, 1000, bottleneck), "resnet"
    if name == "transformer":
        return TransformerLM(30000, seq_len, 512, 6, 8, 2048, dropout), "transformer"
    if name == "bert-base":
        return TransformerLM(30000, max(seq_len, 512), 768, 12, 12, 3072, dropout), "transformer"
    sys.exit(f"unknown model {name}")


def run(a, name, batch, mode, device):
    torch.manual_seed(0)
    model, family = build(name, a.image_size, a.seq_len, a.dropout)
    model = model.to(device).train()
    model.checkpoint_blocks = mode == "checkpoint"
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    if family == "resnet":
        x = torch.randn(batch, 3, a.image_size, a.image_size, device=device)
        y = torch.randint(0, 1000, (batch,), device=device)
        loss_fn = torch.nn.functional.cross_entropy
    else:
        x = torch.randint(0, 30000, (batch, a.seq_len), device=device)
        y = torch.randint(0, 30000, (batch, a.seq_len), device=device)
        loss_fn = lm_loss
    step_model = model
    if mode == "compile":
        import torch._dynamo as dynamo
        import torch._functorch.config as fconfig
        dynamo.reset()  # a fresh compile per batch size, not a recompile of the last graph
        fconfig.activation_memory_budget = a.memory_budget
        step_model = torch.compile(model)

    def step():
        opt.zero_grad(set_to_none=False)
        loss = loss_fn(step_model(x), y)
        loss.backward()
        opt.step()
        return loss

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(a.warmup):
        step()
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else None
    return statistics.median(times), peak


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet152")
    ap.add_argument("--batches", default="4")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--modes", default="eager")
    ap.add_argument("--math", choices=["fp32", "tf32"], default="fp32",
                    help="fp32: TF32 off for both matmuls and convolutions (PyTorch's convolutions "
                         "default to TF32); tf32: on for both")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--memory-budget", type=float, default=0.5)
    ap.add_argument("--csv")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    tf32 = a.math == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    device = torch.device(a.device)
    # Rows are written as they come, so a run stopped part-way (a time limit) keeps what it measured.
    out = open(a.csv, "w", newline="") if a.csv else None
    w = csv.writer(out) if out else None
    if w:
        w.writerow(["model", "batch", "mode", "math", "step_s", "peak_bytes", "error"])

    def add_row(row):
        if w:
            w.writerow(row)
            out.flush()

    for batch in [int(b) for b in a.batches.split(",")]:
        for mode in a.modes.split(","):
            try:
                t, peak = run(a, a.model, batch, mode, device)
            except Exception as e:  # e.g. out of memory, or torch.compile unavailable
                print(f"{a.model} batch {batch} {mode}: failed: {type(e).__name__}: {e}",
                      flush=True)
                add_row([a.model, batch, mode, a.math, "", "", f"{type(e).__name__}"])
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                continue
            peak_txt = f"{peak / 2**30:.3f} GiB" if peak is not None else "n/a"
            print(f"{a.model} batch {batch} {mode} ({a.math}, {device}, "
                  f"{torch.get_num_threads()} threads, torch {torch.__version__}): "
                  f"median step {t:.4f} s, peak allocated {peak_txt}", flush=True)
            add_row([a.model, batch, mode, a.math, f"{t:.6f}", "" if peak is None else peak, ""])
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if out:
        out.close()


if __name__ == "__main__":
    main()
