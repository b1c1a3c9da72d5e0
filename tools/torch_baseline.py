#!/usr/bin/env python3
"""PyTorch baselines beside regen, on the same models, batches and math mode.

For each model and batch size: the median training-step time (forward, backward, SGD step with
momentum 0.9) after warm-up and the peak memory, in up to three modes:
  eager        plain PyTorch
  checkpoint   torch.utils.checkpoint (non-reentrant) around every residual block / encoder layer
  compile      torch.compile with torch._functorch.config.activation_memory_budget (PyTorch 2.4+),
               once per value of --memory-budget (a comma-separated list; the CSV's memory_budget)
Peak memory on CUDA is torch.cuda.max_memory_allocated over the timed steps (the same definition
as regen's peak allocated bytes; peak_kind "cuda_max_memory_allocated" in the CSV). PyTorch's CPU
allocator keeps no statistics, so on the CPU the script measures the C heap instead (peak_kind
"heap_peak"): it compiles tools/heap_peak.c with `cc` into a cache folder ($XDG_CACHE_HOME/regen,
else ~/.cache/regen; or the file named by --heap-lib) and re-executes itself with the library in
LD_PRELOAD. The library counts the live bytes of every malloc/calloc/realloc/posix_memalign/...
block (malloc_usable_size), so the CPU peak is the whole process's live heap at its highest
during the timed steps: tensors, but also PyTorch's own structures (autograd's graph, oneDNN's
scratch buffers, what `import torch` allocated) and CPython's larger blocks. Beside it
the script reports the heap live just before the timed steps (parameters, gradients, optimizer
state, inputs and that overhead: live_before_bytes) and before the model was built (base_bytes);
peak - live_before is what the step itself adds. Memory that a library maps with mmap itself
(OpenBLAS's buffers, thread stacks, CPython's small-object arenas) is not counted. --no-heap
skips it (CPU times only).

On the CPU the script also reports the fastest step and the median step's process CPU time (all
threads), and prints each step's wall and CPU time: on a machine shared with other work, a step
whose CPU time is well below threads x wall time waited for the other work.
With --autocast bf16 (or fp16) every mode trains its forward pass and loss under torch.autocast,
as PyTorch's mixed-precision recipe does.
CSV columns: model, batch, mode, math, step_s (median), peak_bytes, peak_kind, live_before_bytes,
base_bytes, step_min_s, step_cpu_s (CPU only), memory_budget (compile rows), error, autocast; on CUDA,
live_before_bytes and base_bytes are torch.cuda.memory_allocated at those two moments.

Examples:
  /usr/bin/python3 tools/torch_baseline.py --device cpu --threads 2 --model resnet152 --batches 4 \
      --image-size 224 --modes eager,checkpoint --csv torch_resnet152_cpu.csv
  python3 tools/torch_baseline.py --device cuda --model transformer --batches 32,64,128,256 \
      --modes eager,checkpoint,compile --math fp32 --csv torch_transformer.csv
  python3 tools/torch_baseline.py --device cpu --threads 2 --model gpt2 --seq-len 1024 \
      --batches 4 --modes eager --csv torch_gpt2_cpu.csv
"""
import argparse
import ctypes
import csv
import gc
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_models import RESNETS, ResNet, TransformerLM, lm_loss  # noqa: E402
import torch_gpt2  # noqa: E402

# GPT-2's sizes (models/gpt2.h): vocabulary, context, width, layers, heads.
GPT2S = {"gpt2": (50257, 1024, 768, 12, 12), "gpt2-medium": (50257, 1024, 1024, 24, 16)}


HERE = os.path.dirname(os.path.abspath(__file__))
REEXEC_ENV = "REGEN_HEAP_PEAK_REEXEC"  # set in the re-executed process, so it never loops


class HeapCounter:
    """The functions of tools/heap_peak.c, preloaded into this process."""

    def __init__(self, lib):
        self._current = lib.heap_current_bytes
        self._peak = lib.heap_peak_bytes
        self._reset = lib.heap_reset_peak
        self._current.restype = self._peak.restype = ctypes.c_longlong
        self._current.argtypes = self._peak.argtypes = self._reset.argtypes = []
        self._reset.restype = None

    def current(self):
        return self._current()

    def peak(self):
        return self._peak()

    def reset_peak(self):
        self._reset()


def preloaded_heap_counter():
    """The heap counter when tools/heap_peak.c is preloaded (LD_PRELOAD) here, else None."""
    try:
        return HeapCounter(ctypes.CDLL(None))
    except (OSError, AttributeError):
        return None


def build_heap_lib(path):
    """Compiles tools/heap_peak.c into `path` (or, when None, into a cache folder under a name
    that changes with the source). Returns the library's path, or None when it cannot be built."""
    src = os.path.join(HERE, "heap_peak.c")
    if path is None:
        with open(src, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()[:16]
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        path = os.path.join(cache, "regen", f"heap_peak-{digest}.so")
    path = os.path.abspath(path)
    if os.path.exists(path):
        return path
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        print("heap counter: no C compiler (cc) found; CPU memory is not measured", flush=True)
        return None
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    cmd = [cc, "-O2", "-shared", "-fPIC", "-o", tmp, src, "-ldl"]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        print(f"heap counter: {' '.join(cmd)} failed; CPU memory is not measured\n{r.stdout}",
              flush=True)
        return None
    os.replace(tmp, path)  # atomic: a concurrent run sees the whole library or none
    return path


def heap_counter(a):
    """On the CPU: the heap counter, re-executing this command with tools/heap_peak.c in
    LD_PRELOAD first when it is not preloaded yet (this call then does not return). None when
    --no-heap is given or the library cannot be built or loaded (times only, then)."""
    if a.no_heap:
        return None
    counter = preloaded_heap_counter()
    if counter is not None:
        return counter
    if os.environ.get(REEXEC_ENV):
        print(f"heap counter: LD_PRELOAD={os.environ.get('LD_PRELOAD', '')} did not load it; "
              "CPU memory is not measured", flush=True)
        return None
    lib = build_heap_lib(a.heap_lib)
    if lib is None:
        return None
    env = dict(os.environ)
    env["LD_PRELOAD"] = lib + (":" + env["LD_PRELOAD"] if env.get("LD_PRELOAD") else "")
    env[REEXEC_ENV] = "1"
    # The same interpreter, its options and the script's arguments.
    args = getattr(sys, "orig_argv", None) or [sys.executable] + sys.argv
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable] + list(args[1:]), env)


def build(name, image_size, seq_len, dropout):
    if name in RESNETS:
        blocks, bottleneck = RESNETS[name]
        return ResNet(blocks, 64, 1000, bottleneck), "resnet"
    if name == "transformer":
        return TransformerLM(30000, seq_len, 512, 6, 8, 2048, dropout), "transformer"
    if name == "bert-base":
        return TransformerLM(30000, max(seq_len, 512), 768, 12, 12, 3072, dropout), "transformer"
    if name in GPT2S:
        vocab, context, width, layers, heads = GPT2S[name]
        if seq_len > context:
            sys.exit(f"--seq-len {seq_len}: {name}'s context is {context}")
        # nanoGPT's attention where this PyTorch has it (2.0+), else the written-out one.
        sdpa = hasattr(torch.nn.functional, "scaled_dot_product_attention")
        return torch_gpt2.GPT2(vocab, context, width, layers, heads, sdpa), "gpt2"
    sys.exit(f"unknown model {name}")


def run(a, name, batch, mode, device, heap, memory_budget=None):
    """The median step time (s) and a dict of the other figures: peak (bytes over the timed
    steps), live_before (bytes allocated just before them), base (before the model was built),
    kind (of peak), step_min (the fastest step, s), step_cpu (the median step's process CPU time,
    all threads, s), steps (each timed step's wall and CPU time, s)."""
    gc.collect()
    if device.type == "cuda":
        mem = {"kind": "cuda_max_memory_allocated", "base": torch.cuda.memory_allocated()}
    elif heap is not None:
        mem = {"kind": "heap_peak", "base": heap.current()}
    else:
        mem = {"kind": "", "base": None}
    torch.manual_seed(0)
    model, family = build(name, a.image_size, a.seq_len, a.dropout)
    model = model.to(device).train()
    model.checkpoint_blocks = mode == "checkpoint"
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    if family == "resnet":
        x = torch.randn(batch, 3, a.image_size, a.image_size, device=device)
        y = torch.randint(0, 1000, (batch,), device=device)
        loss_fn = torch.nn.functional.cross_entropy
    elif family == "gpt2":
        vocab = GPT2S[name][0]
        x = torch.randint(0, vocab, (batch, a.seq_len), device=device)
        y = torch.randint(0, vocab, (batch, a.seq_len), device=device)

        def loss_fn(logits, targets):
            return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     targets.reshape(-1))
    else:
        x = torch.randint(0, 30000, (batch, a.seq_len), device=device)
        y = torch.randint(0, 30000, (batch, a.seq_len), device=device)
        loss_fn = lm_loss
    step_model = model
    if mode == "compile":
        import torch._dynamo as dynamo
        import torch._functorch.config as fconfig
        dynamo.reset()  # a fresh compile per batch size, not a recompile of the last graph
        fconfig.activation_memory_budget = memory_budget
        step_model = torch.compile(model)

    autocast = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.autocast)

    def step():
        opt.zero_grad(set_to_none=False)
        if autocast is None:
            loss = loss_fn(step_model(x), y)
        else:
            # As PyTorch's AMP recipe: the forward pass and the loss under autocast, backward and
            # the optimizer outside it (on the CPU, fp16 has no GradScaler; bf16 needs none).
            with torch.autocast(device.type, dtype=autocast):
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
        mem["live_before"] = torch.cuda.memory_allocated()
    elif heap is not None:
        gc.collect()  # cyclic garbage of the warm-up is not part of the state a step starts from
        mem["live_before"] = heap.current()
        heap.reset_peak()
    times, cpu_times = [], []
    for _ in range(a.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        step()
        sync()
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)
    mem["step_min"] = min(times)
    mem["step_cpu"] = statistics.median(cpu_times)
    mem["steps"] = list(zip(times, cpu_times))
    if device.type == "cuda":
        mem["peak"] = torch.cuda.max_memory_allocated()
    elif heap is not None:
        mem["peak"] = heap.peak()
    else:
        mem["peak"] = mem["live_before"] = None
    return statistics.median(times), mem


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet152",
                    help="resnet18..resnet152, transformer, bert-base, gpt2 or gpt2-medium")
    ap.add_argument("--batches", default="4")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--modes", default="eager")
    ap.add_argument("--math", choices=["fp32", "tf32"], default="fp32",
                    help="fp32: TF32 off for both matmuls and convolutions (PyTorch's convolutions "
                         "default to TF32); tf32: on for both")
    ap.add_argument("--autocast", choices=["none", "bf16", "fp16"], default="none",
                    help="train every mode under torch.autocast in this dtype (the CSV's autocast "
                         "column); PyTorch's CPU autocast takes bf16")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--memory-budget", default="0.5",
                    help="compile mode's activation_memory_budget, or a comma-separated list of "
                         "them (one compile per value; 1.0: no recomputation, 0.0: the most)")
    ap.add_argument("--csv")
    ap.add_argument("--no-heap", action="store_true",
                    help="on the CPU, do not preload tools/heap_peak.c (no memory figures)")
    ap.add_argument("--heap-lib",
                    help="the heap counter library to preload on the CPU (built from "
                         "tools/heap_peak.c there when missing; default: a cache folder)")
    a = ap.parse_args()
    device = torch.device(a.device)
    heap = heap_counter(a) if device.type == "cpu" else None  # may re-execute this command
    if a.threads:
        torch.set_num_threads(a.threads)
    tf32 = a.math == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    # Rows are written as they come, so a run stopped part-way (a time limit) keeps what it measured.
    out = open(a.csv, "w", newline="") if a.csv else None
    w = csv.writer(out) if out else None
    if w:
        # The first columns are what `regen bench train --torch-csv` reads; keep them first.
        w.writerow(["model", "batch", "mode", "math", "step_s", "peak_bytes", "peak_kind",
                    "live_before_bytes", "base_bytes", "step_min_s", "step_cpu_s", "memory_budget",
                    "error", "autocast"])

    def add_row(row):
        if w:
            w.writerow(row)
            out.flush()

    budgets = [float(b) for b in a.memory_budget.split(",")]
    runs = [(mode, b) for mode in a.modes.split(",")
            for b in (budgets if mode == "compile" else [None])]
    for batch in [int(b) for b in a.batches.split(",")]:
        for mode, budget in runs:
            label = mode if budget is None else f"{mode} (memory budget {budget:g})"
            try:
                t, mem = run(a, a.model, batch, mode, device, heap, budget)
            except Exception as e:  # e.g. out of memory, or torch.compile unavailable
                print(f"{a.model} batch {batch} {label}: failed: {type(e).__name__}: {e}",
                      flush=True)
                add_row([a.model, batch, mode, a.math, "", "", "", "", "", "", "",
                         "" if budget is None else budget, f"{type(e).__name__}", a.autocast])
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                continue
            peak = mem["peak"]
            cpu = device.type == "cpu"
            if not cpu:
                mem_txt = f"peak allocated {peak / 2**30:.3f} GiB"
            elif peak is not None:
                mem_txt = (f"peak heap {peak / 2**20:.1f} MiB, live before step "
                           f"{mem['live_before'] / 2**20:.1f} MiB, before the model "
                           f"{mem['base'] / 2**20:.1f} MiB")
            else:
                mem_txt = "peak heap n/a"
            print(f"{a.model} batch {batch} {label} ({a.math}, autocast {a.autocast}, {device}, "
                  f"{torch.get_num_threads()} threads, torch {torch.__version__}): "
                  f"median step {t:.4f} s"
                  + (f" (min {mem['step_min']:.4f} s, CPU {mem['step_cpu']:.4f} s)" if cpu else "")
                  + f", {mem_txt}", flush=True)
            if cpu:
                print("  steps (wall/CPU s): "
                      + " ".join(f"{wall:.3f}/{c:.3f}" for wall, c in mem["steps"]), flush=True)
            blank = lambda v: "" if v is None else v  # noqa: E731
            add_row([a.model, batch, mode, a.math, f"{t:.6f}", blank(peak),
                     mem["kind"] if peak is not None else "", blank(mem["live_before"]),
                     blank(mem["base"]), f"{mem['step_min']:.6f}",
                     f"{mem['step_cpu']:.6f}" if cpu else "", "" if budget is None else budget, "",
                     a.autocast])
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if out:
        out.close()


if __name__ == "__main__":
    main()
