"""GPT-2 in PyTorch, written for regen's parity tests: the model of models/gpt2.h, parameter for
parameter (the same names and shapes: wte.weight (Vp, C) with the vocabulary V padded to a
multiple of 128, wpe.weight, h.<i>.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc,
mlp.c_proj}.{weight,bias}, ln_f.{weight,bias}), its AdamW parameter groups (weight decay on the
matrices only) and a reader of safetensors files, so a reference can start from weights regen wrote.

Works with PyTorch 1.13 (no scaled_dot_product_attention: the causal attention is written out,
which the parity references use). With `sdpa=True` (PyTorch 2.0+) the attention is
F.scaled_dot_product_attention(is_causal=True), as nanoGPT trains it: tools/torch_baseline.py's
`--model gpt2` speed baseline. With `checkpoint_blocks` set, every block runs under
torch.utils.checkpoint (non-reentrant). Used by tools/make_gpt2_reference.py and
tools/torch_baseline.py.
"""
import json
import math
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F


def padded_vocab(vocab):
    return (vocab + 127) // 128 * 128


class Block(nn.Module):
    def __init__(self, width, heads, sdpa=False):
        super().__init__()
        self.heads = heads
        self.sdpa = sdpa
        self.ln_1 = nn.LayerNorm(width)
        self.attn = nn.Module()
        self.attn.c_attn = nn.Linear(width, 3 * width)
        self.attn.c_proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Module()
        self.mlp.c_fc = nn.Linear(width, 4 * width)
        self.mlp.c_proj = nn.Linear(4 * width, width)

    def attention(self, x):
        B, S, C = x.shape
        q, k, v = self.attn.c_attn(x).split(C, dim=2)
        heads = [t.view(B, S, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v)]
        q, k, v = heads
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.attn.c_proj(y.transpose(1, 2).reshape(B, S, C))
        scores = q @ k.transpose(-2, -1) / math.sqrt(C // self.heads)
        future = torch.ones(S, S, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
        y = F.softmax(scores, dim=-1) @ v
        return self.attn.c_proj(y.transpose(1, 2).reshape(B, S, C))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        h = F.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh")
        return x + self.mlp.c_proj(h)


class GPT2(nn.Module):
    def __init__(self, vocab, context, width, layers, heads, sdpa=False):
        super().__init__()
        self.vocab = vocab
        self.checkpoint_blocks = False
        self.wte = nn.Embedding(padded_vocab(vocab), width)
        self.wpe = nn.Embedding(context, width)
        self.h = nn.ModuleList([Block(width, heads, sdpa) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(width)
        self.init_weights(layers)

    def init_weights(self, layers):
        """GPT-2's: matrices and embeddings N(0, 0.02), the residual projections
        0.02 / sqrt(2 L), biases 0, the padded rows of wte 0 (torch's own RNG: a reference file
        carries the weights it started from)."""
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or \
                    name == "ln_f.weight":
                nn.init.ones_(p)
            else:
                nn.init.zeros_(p)
        with torch.no_grad():
            self.wte.weight[self.vocab:] = 0

    def forward(self, tokens):
        """tokens (B, S) -> logits (B, S, V) over the real vocabulary: the head is wte's first V
        rows, so a padded row is never a class and gets no gradient."""
        S = tokens.shape[1]
        x = self.wte(tokens) + self.wpe(torch.arange(S, device=tokens.device))
        for block in self.h:
            if self.checkpoint_blocks:
                from torch.utils.checkpoint import checkpoint
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.ln_f(x) @ self.wte.weight[: self.vocab].t()


def loss_of(model, tokens, targets):
    logits = model(tokens)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def adamw(model, lr, weight_decay, betas=(0.9, 0.999), eps=1e-8):
    """AdamW with nanoGPT's two groups: decay on the parameters of two or more dimensions."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=lr, betas=betas, eps=eps)


def load_llmc_checkpoint(path):
    """A GPT2 with the sizes and float32 weights of an llm.c checkpoint (version 3: a header of
    256 int32, magic 20240326, then the parameters in llm.c's order, models/gpt2_llmc.h)."""
    with open(path, "rb") as f:
        header = struct.unpack("<256i", f.read(1024))
        blob = f.read()
    if header[0] != 20240326 or header[1] != 3:
        raise ValueError(f"{path}: not an llm.c float32 checkpoint (magic {header[0]}, "
                         f"version {header[1]})")
    maxT, V, L, NH, C, Vp = header[2:8]
    model = GPT2(V, maxT, C, L, NH)
    if padded_vocab(V) != Vp:
        raise ValueError(f"{path}: padded vocabulary {Vp}, not {padded_vocab(V)}")
    values = torch.frombuffer(bytearray(blob), dtype=torch.float32)
    kinds = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
             "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
             "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"]
    order = ["wte.weight", "wpe.weight"] + [f"h.{i}.{k}" for k in kinds for i in range(L)] + \
        ["ln_f.weight", "ln_f.bias"]
    params = dict(model.named_parameters())
    at = 0
    with torch.no_grad():
        for name in order:
            p = params[name]
            p.copy_(values[at:at + p.numel()].reshape(p.shape))
            at += p.numel()
    if at != values.numel():
        raise ValueError(f"{path}: {values.numel()} parameters, the header's sizes need {at}")
    return model


_DTYPES = {"F32": torch.float32, "F64": torch.float64, "I64": torch.int64, "I32": torch.int32}


def load_safetensors(path):
    """The tensors of a safetensors file by name (F32, F64, I64, I32), without extra packages."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        blob = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        if e["dtype"] not in _DTYPES:
            raise ValueError(f"{path}: tensor {name} has dtype {e['dtype']}, not one of "
                             f"{sorted(_DTYPES)}")
        a, b = e["data_offsets"]
        t = torch.frombuffer(bytearray(blob[a:b]), dtype=_DTYPES[e["dtype"]])
        out[name] = t.reshape(e["shape"]).clone()
    return out
