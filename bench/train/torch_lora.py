#!/usr/bin/python3
"""PyTorch CPU baseline for `chorus finetune` speed (docs/finetuning.md, "Speed"): a Llama of a
given shape with random frozen f32 weights and PEFT-style LoRA (A kaiming-uniform, B = 0,
scale alpha/r, no dropout) on the chosen linears, trained with AdamW on random token
sequences; prints training tokens/s. Written against Debian's python3-torch only (no
transformers / peft): the model is the Llama block in plain torch (RMSNorm, rotate-half RoPE,
GQA causal attention (matmul + masked softmax: torch 1.13 has no fused attention), SiLU MLP, untied head).

  torch_lora.py --shape tinyllama-1.1b --rank 16 --targets q,k,v,o --seq-len 256 --threads 2 \
                --steps 4 --warmup-steps 1
"""
import argparse
import ctypes
import json
import math
import sys
import time

import torch
import torch.nn.functional as F

SHAPES = {  # dim, layers, heads, kv_heads, ff, vocab
    "tinyllama-1.1b": (2048, 22, 32, 4, 5632, 32000),
    "stories260k": (64, 5, 8, 4, 172, 512),
}


class LoraLinear(torch.nn.Module):
    def __init__(self, inp, out, rank, alpha, lora):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(out, inp) * 0.02, requires_grad=False)
        self.lora = lora
        if lora:
            self.a = torch.nn.Parameter(torch.empty(rank, inp))
            torch.nn.init.kaiming_uniform_(self.a, a=math.sqrt(5))
            self.b = torch.nn.Parameter(torch.zeros(out, rank))
            self.scale = alpha / rank

    def forward(self, x):
        y = F.linear(x, self.weight)
        if self.lora:
            y = y + F.linear(F.linear(x, self.a), self.b) * self.scale
        return y


def rms(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, cos, sin):
    h = x.shape[-1] // 2
    rot = torch.cat((-x[..., h:], x[..., :h]), dim=-1)
    return x * cos + rot * sin


class Block(torch.nn.Module):
    def __init__(self, d, h, kvh, ff, rank, alpha, targets):
        super().__init__()
        hd = d // h
        self.h, self.kvh, self.hd = h, kvh, hd
        mk = lambda i, o, name: LoraLinear(i, o, rank, alpha, name in targets)
        self.q, self.k, self.v = mk(d, h * hd, "q"), mk(d, kvh * hd, "k"), mk(d, kvh * hd, "v")
        self.o = mk(h * hd, d, "o")
        self.gate, self.up, self.down = mk(d, ff, "gate"), mk(d, ff, "up"), mk(ff, d, "down")
        self.n1 = torch.nn.Parameter(torch.ones(d), requires_grad=False)
        self.n2 = torch.nn.Parameter(torch.ones(d), requires_grad=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        xn = rms(x, self.n1)
        q = self.q(xn).view(b, t, self.h, self.hd).transpose(1, 2)
        k = self.k(xn).view(b, t, self.kvh, self.hd).transpose(1, 2)
        v = self.v(xn).view(b, t, self.kvh, self.hd).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        rep = self.h // self.kvh
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd)
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        a = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1) @ v
        x = x + self.o(a.transpose(1, 2).reshape(b, t, -1))
        xn = rms(x, self.n2)
        return x + self.down(F.silu(self.gate(xn)) * self.up(xn))


class Model(torch.nn.Module):
    def __init__(self, shape, rank, alpha, targets):
        super().__init__()
        d, n_layers, h, kvh, ff, vocab = shape
        self.emb = torch.nn.Parameter(torch.randn(vocab, d) * 0.02, requires_grad=False)
        self.blocks = torch.nn.ModuleList(Block(d, h, kvh, ff, rank, alpha, targets)
                                          for _ in range(n_layers))
        self.norm = torch.nn.Parameter(torch.ones(d), requires_grad=False)
        self.head = torch.nn.Parameter(torch.randn(vocab, d) * 0.02, requires_grad=False)
        hd = d // h
        self.inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))

    def forward(self, tokens):
        t = tokens.shape[1]
        ang = torch.outer(torch.arange(t).float(), self.inv)
        cos = torch.cat((ang.cos(), ang.cos()), -1)
        sin = torch.cat((ang.sin(), ang.sin()), -1)
        x = self.emb[tokens]
        for blk in self.blocks:
            x = blk(x, cos, sin)
        return F.linear(rms(x, self.norm), self.head)


def blas_info():
    """The BLAS this process actually loaded (via torch) and, for OpenBLAS, its config string and
    the kernel it picked (openblas_get_config / openblas_get_corename), so a run records whether
    PyTorch got the machine's best kernels (OPENBLAS_CORETYPE forces one)."""
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            if "blas" in path or "lapack" in path:
                libs.add(path)
    info = {"libraries": sorted(libs)}
    for path in sorted(libs):
        try:
            lib = ctypes.CDLL(path)
            get_config = lib.openblas_get_config
        except (OSError, AttributeError):
            continue
        get_config.restype = ctypes.c_char_p
        info["openblas_config"] = get_config().decode()
        try:
            lib.openblas_get_corename.restype = ctypes.c_char_p
            info["openblas_core"] = lib.openblas_get_corename().decode()
        except AttributeError:
            pass
        break
    return info


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="tinyllama-1.1b", choices=sorted(SHAPES))
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=0)
    ap.add_argument("--targets", default="q,k,v,o")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup-steps", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    shape = SHAPES[a.shape]
    model = Model(shape, a.rank, a.alpha or 2.0 * a.rank, set(a.targets.split(",")))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0)
    times = []
    for step in range(a.warmup_steps + a.steps):
        tokens = torch.randint(0, shape[5], (a.batch, a.seq_len + 1))
        t0 = time.perf_counter()
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, shape[5]), tokens[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        if step >= a.warmup_steps:
            times.append(dt)
        print(f"torch step {step + 1}: loss {loss.item():.4f}, {dt:.2f} s", file=sys.stderr)
    tok = a.batch * a.seq_len
    times.sort()
    print(json.dumps({"torch": torch.__version__, "threads": a.threads,
                      "trainable": sum(p.numel() for p in params),
                      "tokens_per_s_median": tok / times[len(times) // 2],
                      "blas": blas_info(),
                      "step_s": times}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
