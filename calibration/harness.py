"""Measure a GPU for kvsim: ``python -m calibration.harness --model M --device cuda --out FILE.csv``.

Times, at the model's real per-rank shapes and with random weights (nothing
is downloaded):

* ``op``: the projection GEMMs (``qkv_proj``, ``o_proj``, ``mlp_gate_up``,
  ``mlp_down``, ``lm_head``) over token counts;
* ``copy``: device-to-device copies (HBM bandwidth; the fit gives it to the
  elementwise ops);
* ``prefill_attention``: ``torch.nn.functional.scaled_dot_product_attention``
  for a chunk of new tokens after a cached context (bottom-right causal mask);
* ``decode_attention``: the Triton paged decode-attention kernel
  (``paged_attention.py``) reading a block table, over batch and context;
* ``layer_step``: one whole transformer layer (norms, QKV, RoPE, attention,
  O, MLP, residuals) for mixed prefill + decode batches.

Each row is the median of ``--reps`` timed calls after ``--warmup`` untimed
ones, with the 10th/90th percentiles (CUDA events on a GPU, the wall clock on
a CPU). The CSV is kvsim's calibration format (``kvsim/cost/fit.py``), so
``kvsim calibrate fit --data FILE.csv --gpu GPU --model M --out P.json``
fits a profile from it.

``--device cpu`` runs the same code on tiny shapes (the model's structure,
shrunk) with Triton in interpreter mode, so measure -> fit -> simulate is
tested without a GPU; it then also writes ``FILE.model.yaml`` and
``FILE.gpu.yaml`` describing what was measured, to pass to ``--model`` and
``--gpu``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Grid:
    gemm_tokens: tuple[int, ...]
    lm_head_seqs: tuple[int, ...]
    copy_bytes: tuple[int, ...]
    prefill: tuple[tuple[int, int], ...]              # (chunk, context)
    decode: tuple[tuple[int, int], ...]               # (num_seqs, context per seq)
    layer: tuple[tuple[int, int, int, int], ...]      # (chunk, context, num_decode, decode context)
    block_size: int


GPU_GRID = Grid(
    gemm_tokens=(1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 512, 640, 768,
                 1024, 1280, 1536, 2048, 2560, 3072, 4096, 6144, 8192),
    lm_head_seqs=(1, 2, 4, 8, 16, 32, 64, 128, 256),
    copy_bytes=tuple(2 ** k for k in range(20, 31, 2)),
    prefill=tuple((c, p) for c in (64, 128, 256, 512, 1024, 2048, 4096) for p in (0, 512, 2048, 8192)),
    decode=tuple((n, k) for n in (1, 4, 16, 64, 256) for k in (128, 512, 2048, 8192)),
    layer=((0, 0, 1, 1024), (0, 0, 16, 1024), (0, 0, 64, 2048), (0, 0, 256, 512),
           (128, 0, 0, 0), (512, 0, 0, 0), (2048, 0, 0, 0), (512, 2048, 0, 0),
           (512, 0, 32, 1024), (1024, 1024, 64, 2048), (256, 0, 128, 512)),
    block_size=16,
)
CPU_GRID = Grid(
    gemm_tokens=(1, 2, 4, 8, 16, 32, 64, 128),
    lm_head_seqs=(1, 2, 4, 8),
    copy_bytes=(1 << 16, 1 << 18, 1 << 20, 1 << 22),
    prefill=((8, 0), (16, 0), (32, 0), (8, 16), (16, 32), (32, 32)),
    decode=((1, 16), (2, 16), (1, 48), (3, 32), (2, 64)),
    layer=((0, 0, 2, 32), (16, 0, 0, 0), (16, 16, 2, 16)),
    block_size=8,
)

# The smallest run that still has every kind of row (the test suite's CPU path).
QUICK_GRID = Grid(
    gemm_tokens=(1, 4, 16, 64), lm_head_seqs=(1, 4), copy_bytes=(1 << 16, 1 << 20),
    prefill=((8, 0), (16, 8), (16, 0), (8, 16)), decode=((1, 16), (2, 16), (2, 24)),
    layer=((0, 0, 2, 16), (16, 0, 0, 0)), block_size=8,
)


def tiny_model_fields(model) -> dict:
    """The model's structure at CPU-friendly sizes (GQA ratio and gating kept)."""
    group = max(1, model.num_attention_heads // max(1, model.num_kv_heads))
    heads = 4
    kv = max(1, heads // min(group, heads))
    return dict(name=f"tiny-{model.name}", num_layers=2, hidden_size=64, num_attention_heads=heads,
                num_kv_heads=kv, head_dim=16, intermediate_size=128, vocab_size=512,
                gated_mlp=bool(model.gated_mlp), tie_word_embeddings=False,
                max_position_embeddings=4096, dtype_bytes=4)


# ------------------------------------------------------------------ timing

class Timer:
    def __init__(self, torch, device: str, warmup: int, reps: int):
        self.torch, self.device, self.warmup, self.reps = torch, device, warmup, reps

    def __call__(self, fn) -> tuple[float, float, float]:
        """(median, p10, p90) seconds of ``fn()``."""
        torch = self.torch
        for _ in range(self.warmup):
            fn()
        samples = []
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
            for _ in range(self.reps):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) * 1e-3)
        else:
            for _ in range(self.reps):
                t0 = time.perf_counter()
                fn()
                samples.append(time.perf_counter() - t0)
        samples.sort()
        q = lambda f: samples[min(len(samples) - 1, int(round(f * (len(samples) - 1))))]
        return q(0.5), q(0.1), q(0.9)


# ------------------------------------------------------------------ one layer

class Layer:
    """One decoder layer with random weights at the given per-rank shapes."""

    def __init__(self, torch, shapes, model, dtype, device, gen):
        self.torch, self.s, self.dtype, self.device = torch, shapes, dtype, device
        h = shapes.hidden_size
        qkv_n = next(o for o in shapes.ops if o.name == "qkv_proj").gemm_n
        inter_n = next(o for o in shapes.ops if o.name == "mlp_gate_up").gemm_n
        o_k = next(o for o in shapes.ops if o.name == "o_proj").gemm_k
        rnd = lambda *shape: (torch.randn(*shape, generator=gen) / math.sqrt(shape[0])).to(device, dtype)
        self.w_qkv, self.w_o = rnd(h, qkv_n), rnd(o_k, h)
        self.w_gate_up = rnd(h, inter_n)
        self.w_down = rnd(inter_n // (2 if model.gated_mlp else 1), h)
        self.gated = bool(model.gated_mlp)
        self.norm1 = torch.ones(h, device=device, dtype=dtype)
        self.norm2 = torch.ones(h, device=device, dtype=dtype)

    def rms_norm(self, x, w):
        xf = x.float()
        return (xf * self.torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w

    def rope(self, x, positions):
        torch = self.torch
        d = x.shape[-1]
        inv = 1.0 / (10000 ** (torch.arange(0, d, 2, device=x.device).float() / d))
        ang = positions.float()[:, None] * inv[None, :]
        cos, sin = ang.cos()[:, None, :].to(x.dtype), ang.sin()[:, None, :].to(x.dtype)
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)

    def forward(self, x, positions, prefill, decode):
        """``prefill``: (chunk, cached K, cached V) or None; ``decode``: paged-cache args or None."""
        torch, s = self.torch, self.s
        hq, hkv, d = s.q_heads, s.kv_heads, s.head_dim
        res = x
        y = self.rms_norm(x, self.norm1) @ self.w_qkv
        q, k, v = y.split([hq * d, hkv * d, hkv * d], dim=-1)
        q = self.rope(q.reshape(-1, hq, d), positions)
        k = self.rope(k.reshape(-1, hkv, d), positions)
        v = v.reshape(-1, hkv, d)
        outs = []
        c = 0
        if prefill is not None:
            c, k_cached, v_cached = prefill
            outs.append(prefill_attention(torch, q[:c], k[:c], v[:c], k_cached, v_cached))
        if decode is not None:
            from calibration.paged_attention import paged_decode_attention
            k_cache, v_cache, table, lens = decode
            outs.append(paged_decode_attention(q[c:].contiguous(), k_cache, v_cache, table, lens))
        attn = torch.cat(outs, dim=0).reshape(x.shape[0], hq * d)
        x = res + attn @ self.w_o
        y = self.rms_norm(x, self.norm2) @ self.w_gate_up
        if self.gated:
            gate, up = y.chunk(2, dim=-1)
            y = torch.nn.functional.silu(gate) * up
        else:
            y = torch.nn.functional.gelu(y)
        return x + y @ self.w_down


def prefill_attention(torch, q, k_new, v_new, k_cached, v_cached):
    """SDPA of a chunk against its cached context plus itself (bottom-right causal).

    Uses torch's ``causal_lower_right`` bias and ``enable_gqa`` where this
    torch has them, so a flash/memory-efficient kernel runs (no dense mask,
    no copies of the KV heads), as in a serving engine.
    """
    c, hq, d = q.shape
    k = torch.cat([k_cached, k_new], dim=0)
    v = torch.cat([v_cached, v_new], dim=0)
    p = k.shape[0] - c
    q4, k4, v4 = (t.transpose(0, 1)[None] for t in (q, k, v))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    try:
        from torch.nn.attention.bias import causal_lower_right
        mask = causal_lower_right(c, p + c) if p else None
        out = sdpa(q4, k4, v4, attn_mask=mask, is_causal=not p, enable_gqa=True)
    except (ImportError, TypeError, RuntimeError):
        group = hq // k.shape[1]
        k4 = k4.repeat_interleave(group, dim=1)
        v4 = v4.repeat_interleave(group, dim=1)
        qi = torch.arange(c, device=q.device)[:, None]
        kj = torch.arange(p + c, device=q.device)[None, :]
        out = sdpa(q4, k4, v4, attn_mask=kj <= qi + p)
    return out[0].transpose(0, 1)


def reference_prefill_attention(torch, q, k_new, v_new, k_cached, v_cached):
    """Plain-torch softmax attention with an explicit mask (checks ``prefill_attention``)."""
    c, hq, d = q.shape
    k = torch.cat([k_cached, k_new], dim=0).float()
    v = torch.cat([v_cached, v_new], dim=0).float()
    p = k.shape[0] - c
    group = hq // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("chd,nhd->hcn", q.float(), k) / math.sqrt(d)
    keep = torch.arange(p + c)[None, :] <= torch.arange(c)[:, None] + p
    scores = scores.masked_fill(~keep[None], float("-inf"))
    return torch.einsum("hcn,nhd->chd", scores.softmax(-1), v).to(q.dtype)


# ------------------------------------------------------------------ measurement

def measure(model, tp: int, device: str, grid: Grid, warmup: int, reps: int, dtype_name: str,
            log=print) -> list[dict]:
    import torch

    from calibration.paged_attention import make_paged_cache, paged_decode_attention
    from kvsim.cost.features import rank_shapes

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype_name]
    gen = torch.Generator().manual_seed(0)
    timer = Timer(torch, device, warmup, reps)
    shapes = rank_shapes(model, tp)
    rows: list[dict] = []

    def add(kind, timing, **cols):
        med, p10, p90 = timing
        rows.append({"kind": kind, **cols, "tp": tp, "time_s": med, "time_p10_s": p10,
                     "time_p90_s": p90, "reps": reps})

    rand = lambda *shape: torch.randn(*shape, generator=gen).to(device, dtype)
    log("GEMMs")
    for op in shapes.ops:
        if not op.gemm_k or op.num_experts:
            continue
        w = rand(op.gemm_k, op.gemm_n)
        counts = grid.lm_head_seqs if op.name == "lm_head" else grid.gemm_tokens
        for n in counts:
            x = rand(n, op.gemm_k)
            add("op", timer(lambda: x @ w), op=op.name, num_tokens=n)
    log("copies")
    for nbytes in grid.copy_bytes:
        src = torch.empty(nbytes, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        add("copy", timer(lambda: dst.copy_(src)), nbytes=nbytes)
    hq, hkv, d = shapes.q_heads, shapes.kv_heads, shapes.head_dim
    log("prefill attention")
    for c, p in grid.prefill:
        q, kn, vn = rand(c, hq, d), rand(c, hkv, d), rand(c, hkv, d)
        kc, vc = rand(p, hkv, d), rand(p, hkv, d)
        add("prefill_attention", timer(lambda: prefill_attention(torch, q, kn, vn, kc, vc)),
            prefill_chunk=c, prefill_context=p)
    log("decode attention (Triton, paged)")
    for n, k in grid.decode:
        cache = make_paged_cache([k] * n, hkv, d, grid.block_size, dtype, device, gen)
        q = rand(n, hq, d)
        add("decode_attention", timer(lambda: paged_decode_attention(q, *cache)),
            num_decode=n, decode_context=k)
    log("whole layers")
    layer = Layer(torch, shapes, model, dtype, device, gen)
    for c, p, n, k in grid.layer:
        tokens = c + n
        x = rand(tokens, shapes.hidden_size)
        positions = torch.cat([torch.arange(p, p + c), torch.full((n,), k)]).to(device)
        prefill = (c, rand(p, hkv, d), rand(p, hkv, d)) if c else None
        decode = make_paged_cache([k] * n, hkv, d, grid.block_size, dtype, device, gen) if n else None
        add("layer_step", timer(lambda: layer.forward(x, positions, prefill, decode)),
            prefill_chunk=c, prefill_context=p, num_decode=n, decode_context=k)
    return rows


COLUMNS = ["kind", "op", "num_tokens", "prefill_chunk", "prefill_context", "num_decode",
           "decode_context", "nbytes", "tp", "time_s", "time_p10_s", "time_p90_s", "reps"]


def write_csv(rows: list[dict], path: Path) -> None:
    import csv
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c, "") for c in COLUMNS})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m calibration.harness", description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="kvsim catalog model (its shapes are measured)")
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (cpu: tiny shapes)")
    parser.add_argument("--out", required=True, help="CSV to write (calibration/data/NAME.csv)")
    parser.add_argument("--tp", type=int, default=1, help="measure the per-rank shapes of this TP degree")
    parser.add_argument("--dtype", default=None, choices=["bf16", "fp16", "fp32"],
                        help="default bf16 on a GPU, fp32 on a CPU")
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="a minimal grid (tests)")
    args = parser.parse_args(argv)

    cpu = args.device == "cpu"
    if cpu:
        # Triton runs its kernels in Python on a CPU; must be set before triton is imported.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    from kvsim.cost.features import rank_shapes
    from kvsim.specs import load_model
    from kvsim.specs.model import ModelSpec

    model = load_model(args.model)
    out = Path(args.out)
    if cpu:
        model = ModelSpec(**tiny_model_fields(model))
        torch.set_num_threads(1)    # tiny ops: thread hand-offs would dominate the timings
    elif not torch.cuda.is_available():
        print(f"--device {args.device}: no CUDA device here; use --device cpu for the tiny-shape run",
              file=sys.stderr)
        return 2
    dtype = args.dtype or ("fp32" if cpu else "bf16")
    grid = QUICK_GRID if args.quick else (CPU_GRID if cpu else GPU_GRID)
    warmup = args.warmup if args.warmup is not None else (1 if cpu else 5)
    reps = args.reps if args.reps is not None else (3 if cpu else 20)
    started = time.time()
    rows = measure(model, args.tp, args.device, grid, warmup, reps, dtype,
                   log=lambda m: print(f"[harness] {m}", file=sys.stderr))
    write_csv(rows, out)
    device_name = "cpu" if cpu else torch.cuda.get_device_name(torch.device(args.device))
    meta = {"model": model.name, "tp": args.tp, "device": device_name, "dtype": dtype,
            "torch": torch.__version__, "warmup": warmup, "reps": reps, "rows": len(rows),
            "seconds": round(time.time() - started, 1),
            "command": "python -m calibration.harness " + " ".join(argv if argv is not None else sys.argv[1:])}
    out.with_suffix(".meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    if cpu:
        import yaml
        fields = tiny_model_fields(load_model(args.model))
        out.with_suffix(".model.yaml").write_text(yaml.safe_dump(fields, sort_keys=False))
        copies = [r for r in rows if r["kind"] == "copy"]
        bw = max(2 * r["nbytes"] / r["time_s"] for r in copies) / 1e9
        up = next(o for o in rank_shapes(model, args.tp).ops if o.name == "mlp_gate_up")
        flops = max(up.flops(r["num_tokens"]) / r["time_s"] for r in rows
                    if r["kind"] == "op" and r["op"] == "mlp_gate_up")
        # what this CPU reached, so the roofline column of the fit means something
        gpu = {"name": "cpu-harness", "memory_gib": 8, "hbm_bandwidth_gbps": round(bw, 3),
               "bf16_tflops": float(f"{flops / 1e12:.4g}"), "fp8_tflops": None,
               "interconnect_bandwidth_gbps": 1.0, "interconnect_latency_us": 10.0,
               "pcie_bandwidth_gbps": 1.0}
        out.with_suffix(".gpu.yaml").write_text(yaml.safe_dump(gpu, sort_keys=False))
    print(f"wrote {out} ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
