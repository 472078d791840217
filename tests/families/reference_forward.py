#!/usr/bin/env python3
"""Reference forward of the Qwen3, Phi-3 and Gemma 2/3 families in numpy (float64).

Written from each family's published definition (the Hugging Face `transformers` modeling files
Qwen3ForCausalLM, Phi3ForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM and their config.json
fields), independently of Chorus: it reads a Hugging Face directory (config.json +
model.safetensors, f32) and optionally a PEFT LoRA adapter directory, whose deltas it merges into
the weights (W + alpha/r * B @ A, on the fused Phi-3 matrices when the adapter targets them).

usage: reference_forward.py MODEL_DIR TOKENS_FILE OUT_FILE [ADAPTER_DIR]
  TOKENS_FILE: whitespace-separated token ids; OUT_FILE: raw little-endian f32 logits
  [n_tokens, vocab] of every position (one causal forward over the whole sequence).
"""
import json
import struct
import sys

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            raise SystemExit(f"{name}: only F32 tensors are supported by this reference")
        b, e = info["data_offsets"]
        out[name] = np.frombuffer(data[base + b:base + e], dtype="<f4").reshape(info["shape"]).astype(np.float64)
    return out


def merge_lora(w, adapter_dir):
    cfg = json.load(open(adapter_dir + "/adapter_config.json"))
    scale = cfg["lora_alpha"] / cfg["r"]
    ad = read_safetensors(adapter_dir + "/adapter_model.safetensors")
    merged = 0
    for name, a in ad.items():
        if ".lora_A." not in name:
            continue
        b = ad[name.replace(".lora_A.", ".lora_B.")]
        module = name.split(".lora_A.")[0]
        target = module[module.index("model.layers."):] + ".weight"
        w[target] = w[target] + scale * (b @ a)
        merged += 1
    if merged == 0:
        raise SystemExit("adapter has no lora_A tensors")


def rms_norm(x, weight, eps, plus_one):
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y * ((1.0 + weight) if plus_one else weight)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def silu(x):
    return x / (1.0 + np.exp(-x))


def rope_tables(positions, rot, base, ext=None, linear=1.0, attn_factor=1.0):
    inv = 1.0 / (base ** (np.arange(0, rot, 2, dtype=np.float64) / rot))
    if ext is not None:
        inv = inv / np.asarray(ext, dtype=np.float64)
    inv = inv / linear
    ang = np.outer(positions, inv)                      # [T, rot/2]
    emb = np.concatenate([ang, ang], axis=-1)           # HF: cat(freqs, freqs)
    return np.cos(emb) * attn_factor, np.sin(emb) * attn_factor


def apply_rope(x, cos, sin, rot):
    # x: [T, H, D]; rotate-half on the first `rot` dims of each head.
    xr, xp = x[..., :rot], x[..., rot:]
    h = rot // 2
    rotated = np.concatenate([-xr[..., h:], xr[..., :h]], axis=-1)
    out = xr * cos[:, None, :] + rotated * sin[:, None, :]
    return np.concatenate([out, xp], axis=-1)


def forward(cfg, w, tokens):
    arch = cfg["architectures"][0]
    fam = {"Qwen3ForCausalLM": "qwen3", "Phi3ForCausalLM": "phi3",
           "Gemma2ForCausalLM": "gemma2", "Gemma3ForCausalLM": "gemma3"}[arch]
    gemma = fam.startswith("gemma")
    d, L = cfg["hidden_size"], cfg["num_hidden_layers"]
    H, KV = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    hd = cfg.get("head_dim") or d // H
    eps = cfg["rms_norm_eps"]
    T = len(tokens)
    pos = np.arange(T)
    rot = int(hd * cfg.get("partial_rotary_factor", 1.0))
    theta = cfg.get("rope_theta", 10000.0)
    rs = cfg.get("rope_scaling") or {}
    rtype = rs.get("rope_type", rs.get("type"))
    if rtype in ("longrope", "su"):
        orig = cfg.get("original_max_position_embeddings", cfg["max_position_embeddings"])
        ext = rs["long_factor"] if T > orig else rs["short_factor"]
        factor = cfg["max_position_embeddings"] / orig
        af = rs.get("attention_factor")
        if af is None:
            af = 1.0 if factor <= 1.0 else np.sqrt(1 + np.log(factor) / np.log(orig))
        cos_g, sin_g = rope_tables(pos, rot, theta, ext=ext, attn_factor=af)
    elif rtype == "linear":
        cos_g, sin_g = rope_tables(pos, rot, theta, linear=rs["factor"])
    else:
        cos_g, sin_g = rope_tables(pos, rot, theta)
    cos_l, sin_l = cos_g, sin_g
    if fam == "gemma3":
        cos_l, sin_l = rope_tables(pos, rot, cfg.get("rope_local_base_freq", 10000.0))

    window = cfg.get("sliding_window") or 0
    if gemma:
        if "layer_types" in cfg:
            sliding = [t == "sliding_attention" for t in cfg["layer_types"]]
        elif fam == "gemma2":
            sliding = [l % 2 == 0 for l in range(L)]
        else:
            p = cfg.get("sliding_window_pattern", 6)
            sliding = [(l + 1) % p != 0 for l in range(L)]
        scale = cfg["query_pre_attn_scalar"] ** -0.5
        softcap = cfg.get("attn_logit_softcapping") or 0.0
    else:
        sliding = [fam == "phi3" and window > 0] * L
        scale = hd ** -0.5
        softcap = 0.0

    p = "model.layers."
    x = w["model.embed_tokens.weight"][np.asarray(tokens)]
    if gemma:
        x = x * np.float64(np.float32(d ** 0.5))
    i_idx, j_idx = np.meshgrid(pos, pos, indexing="ij")
    causal = j_idx <= i_idx
    for l in range(L):
        pre = f"{p}{l}."
        h = rms_norm(x, w[pre + "input_layernorm.weight"], eps, gemma)
        if fam == "phi3":
            qkv = h @ w[pre + "self_attn.qkv_proj.weight"].T
            q, k, v = np.split(qkv, [H * hd, H * hd + KV * hd], axis=-1)
        else:
            q = h @ w[pre + "self_attn.q_proj.weight"].T
            k = h @ w[pre + "self_attn.k_proj.weight"].T
            v = h @ w[pre + "self_attn.v_proj.weight"].T
        q = q.reshape(T, H, hd)
        k = k.reshape(T, KV, hd)
        v = v.reshape(T, KV, hd)
        if fam in ("qwen3", "gemma3"):
            q = rms_norm(q, w[pre + "self_attn.q_norm.weight"], eps, gemma)
            k = rms_norm(k, w[pre + "self_attn.k_norm.weight"], eps, gemma)
        cos, sin = (cos_l, sin_l) if (sliding[l] and fam == "gemma3") else (cos_g, sin_g)
        q = apply_rope(q, cos, sin, rot)
        k = apply_rope(k, cos, sin, rot)
        mask = causal & ((i_idx - j_idx < window) if (sliding[l] and window > 0) else True)
        att = np.zeros((T, H, hd))
        for hh in range(H):
            g = hh // (H // KV)
            s = (q[:, hh, :] @ k[:, g, :].T) * scale
            if softcap:
                s = softcap * np.tanh(s / softcap)
            s = np.where(mask, s, -np.inf)
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s = s / s.sum(axis=-1, keepdims=True)
            att[:, hh, :] = s @ v[:, g, :]
        o = att.reshape(T, H * hd) @ w[pre + "self_attn.o_proj.weight"].T
        if gemma:
            o = rms_norm(o, w[pre + "post_attention_layernorm.weight"], eps, True)
            x = x + o
            h = rms_norm(x, w[pre + "pre_feedforward_layernorm.weight"], eps, True)
        else:
            x = x + o
            h = rms_norm(x, w[pre + "post_attention_layernorm.weight"], eps, False)
        if fam == "phi3":
            gu = h @ w[pre + "mlp.gate_up_proj.weight"].T
            gate, up = np.split(gu, 2, axis=-1)
        else:
            gate = h @ w[pre + "mlp.gate_proj.weight"].T
            up = h @ w[pre + "mlp.up_proj.weight"].T
        m = (gelu_tanh(gate) if gemma else silu(gate)) * up
        m = m @ w[pre + "mlp.down_proj.weight"].T
        if gemma:
            m = rms_norm(m, w[pre + "post_feedforward_layernorm.weight"], eps, True)
        x = x + m
    x = rms_norm(x, w["model.norm.weight"], eps, gemma)
    head = w.get("lm_head.weight")
    if head is None or cfg.get("tie_word_embeddings", False):
        head = w["model.embed_tokens.weight"]
    logits = x @ head.T
    cap = cfg.get("final_logit_softcapping") or 0.0 if gemma else 0.0
    if cap:
        logits = cap * np.tanh(logits / cap)
    return logits


def main():
    model_dir, tokens_file, out_file = sys.argv[1:4]
    cfg = json.load(open(model_dir + "/config.json"))
    w = read_safetensors(model_dir + "/model.safetensors")
    if len(sys.argv) > 4:
        merge_lora(w, sys.argv[4])
    tokens = [int(t) for t in open(tokens_file).read().split()]
    logits = forward(cfg, w, tokens)
    logits.astype("<f4").tofile(out_file)


if __name__ == "__main__":
    main()
