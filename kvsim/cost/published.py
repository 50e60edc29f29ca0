"""Published GPU measurements, read into kvsim's calibration format, and the shipped profiles.

Sources (a folder of published tables, by default ``../shared/data/profiles/``
seen from the repository root; see its ``MORE.md``). Every reader takes that
folder as ``root`` (:func:`data_root` resolves the ``--data`` option of
``kvsim calibrate``): kvsim itself never looks outside its package.

* Vidur (microsoft/vidur, MIT) ``compute/<gpu>/<org>/<model>/mlp.csv``: per-op
  kernel times (ms) of one layer against ``num_tokens`` and TP; its op names
  map onto kvsim's in ``VIDUR_OPS``.
* Vidur ``attention/a100_llama-2-70b_tp2_attention.csv``: prefill attention
  (batch 1, ``prefill_chunk_size`` new tokens after ``kv_cache_size`` cached)
  and decode attention (``batch_size`` sequences each holding
  ``kv_cache_size`` tokens), FlashAttention on A100, per rank of Llama-2-70B
  at TP2 (32 query / 4 KV heads of 128). Coefficients are per FLOP and per KV
  byte, so other models' attention follows from their head counts
  (``features.prefill_attention_work``): that is how it scales to them.
  H100 has no attention table: its coefficients are the A100 ones scaled by
  the ratio of peak FLOP/s (compute term) and HBM bandwidth (memory term).
* Vidur ``network/<node>/all_reduce.csv``: NCCL all-reduce, ``size`` in bytes,
  rank 0, GPUs all in one node.
* Vidur ``cpu_overheads/a100.csv``: per-step CPU time of a vLLM-based engine
  (schedule + prepare inputs + sampler + output processing, ms) against batch
  size, for a few (model, TP) pairs; a profile takes the pair nearest its own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

# Where the published tables are unless told: the project's layout, seen from
# the repository root (the folder `kvsim calibrate` is run from in a checkout).
DEFAULT_DATA_ROOT = Path("..") / "shared" / "data" / "profiles"
DATA_ROOT_ENV = "KVSIM_PROFILE_DATA"


def data_root(root: str | os.PathLike | None = None) -> Path:
    """The folder of published tables: ``root``, else ``$KVSIM_PROFILE_DATA``, else
    ``../shared/data/profiles`` relative to the current directory.

    Raises ``ValueError`` naming the folder and how to give another when it is
    not there, before anything is read.
    """
    env = os.environ.get(DATA_ROOT_ENV)
    path = Path(root) if root is not None else Path(env) if env else DEFAULT_DATA_ROOT
    if not path.is_dir():
        how = ("--data" if root is not None else f"${DATA_ROOT_ENV}" if env
               else f"the default {DEFAULT_DATA_ROOT}")
        raise ValueError(f"published data: {how} -> {path} is not a folder; give the folder of "
                         f"published tables (vidur/, splitwise/, llmservingsim/, apex_plus/) "
                         f"with --data DIR or ${DATA_ROOT_ENV}")
    return path


VIDUR_OPS = {
    "emb": "embedding", "input_layernorm": "input_norm", "attn_pre_proj": "qkv_proj",
    "attn_rope": "rope", "attn_post_proj": "o_proj",
    "post_attention_layernorm": "post_attn_norm", "mlp_up_proj": "mlp_gate_up",
    "mlp_act": "mlp_act", "mlp_down_proj": "mlp_down", "add": "residual_add",
}


def table_model(name: str, n_head: int, n_kv_head: int, n_embd: int, n_expanded_embd: int,
                vocab_size: int, gated: bool = True):
    """The shapes a measurement table was taken at (its own columns), as a ModelSpec.

    Only per-op shapes matter for fitting, so one layer is enough.
    """
    from kvsim.specs.model import ModelSpec
    return ModelSpec(name=name, num_layers=1, hidden_size=n_embd, num_attention_heads=n_head,
                     num_kv_heads=n_kv_head, head_dim=n_embd // n_head,
                     intermediate_size=n_expanded_embd, vocab_size=vocab_size, gated_mlp=gated,
                     tie_word_embeddings=False, max_position_embeddings=4096)


def read_vidur_ops(gpu_dir: str, hf_model: str, tp: int, *, root: Path):
    """(rows of kind ``op``, the table's ModelSpec, source record)."""
    rel = f"vidur/compute/{gpu_dir}/{hf_model}/mlp.csv"
    df = pd.read_csv(Path(root) / rel)
    df = df[df["num_tensor_parallel_workers"] == tp]
    if df.empty:
        raise ValueError(f"{rel}: no rows with num_tensor_parallel_workers == {tp}")
    first = df.iloc[0]
    model = table_model(hf_model.split("/")[-1], int(first.n_head), int(first.n_kv_head),
                        int(first.n_embd), int(first.n_expanded_embd), int(first.vocab_size),
                        bool(first.use_gated_mlp))
    frames = []
    for vidur_name, op in VIDUR_OPS.items():
        col = f"time_stats.{vidur_name}.median"
        frames.append(pd.DataFrame({
            "kind": "op", "op": op, "num_tokens": df["num_tokens"].to_numpy(),
            "time_s": df[col].to_numpy() * 1e-3,
            "time_p10_s": df[f"time_stats.{vidur_name}.min"].to_numpy() * 1e-3,
            "time_p90_s": df[f"time_stats.{vidur_name}.max"].to_numpy() * 1e-3,
        }))
    rows = pd.concat(frames, ignore_index=True)
    rows = rows[rows["time_s"] > 0]
    return rows, model, {"part": "ops", "file": rel, "rows": f"num_tensor_parallel_workers == {tp}",
                         "n_rows": int(len(rows))}


ATTENTION_FILE = "vidur/attention/a100_llama-2-70b_tp2_attention.csv"


def read_vidur_attention(*, root: Path):
    """(rows of kind prefill_attention / decode_attention, the table's ModelSpec, TP, source)."""
    df = pd.read_csv(Path(root) / ATTENTION_FILE)
    reshape = (df["time_stats.attn_input_reshape.median"].fillna(0)
               + df["time_stats.attn_output_reshape.median"].fillna(0))
    pre = df[df["is_prefill"]]
    dec = df[~df["is_prefill"]]
    rows = pd.concat([
        pd.DataFrame({"kind": "prefill_attention",
                      "prefill_chunk": pre["prefill_chunk_size"].to_numpy(),
                      "prefill_context": pre["kv_cache_size"].to_numpy(),
                      "time_s": (pre["time_stats.attn_prefill.median"] + reshape[pre.index]).to_numpy() * 1e-3}),
        pd.DataFrame({"kind": "decode_attention",
                      "num_decode": dec["batch_size"].to_numpy(),
                      "decode_context": dec["kv_cache_size"].to_numpy(),
                      "time_s": (dec["time_stats.attn_decode.median"] + reshape[dec.index]).to_numpy() * 1e-3}),
    ], ignore_index=True)
    first = df.iloc[0]
    n_head, n_kv, n_embd = int(first.n_q_head), int(first.n_kv_head), int(first.n_embd)
    model = table_model("Llama-2-70b-hf", n_head, n_kv, n_embd, 28672, 32000)
    return rows, model, int(first.num_tensor_parallel_workers), {
        "part": "attention", "file": ATTENTION_FILE, "rows": "all (prefill: is_prefill; decode: not)",
        "n_rows": int(len(rows))}


def read_vidur_allreduce(node_dir: str, tp: int, *, root: Path):
    rel = f"vidur/network/{node_dir}/all_reduce.csv"
    df = pd.read_csv(Path(root) / rel)
    df = df[(df["rank"] == 0) & (df["num_workers"] == tp) & (df["devices_per_node"] == tp)]
    if df.empty:
        raise ValueError(f"{rel}: no single-node rows for {tp} GPUs")
    rows = pd.DataFrame({"kind": "allreduce", "nbytes": df["size"].to_numpy(), "tp": tp,
                         "time_s": df["time_stats.all_reduce.median"].to_numpy() * 1e-3})
    return rows, {"part": "allreduce", "file": rel,
                  "rows": f"rank 0, num_workers == devices_per_node == {tp}", "n_rows": int(len(rows))}


CPU_OVERHEAD_PARTS = ("schedule_median", "sampler_e2e_median", "prepare_inputs_e2e_median",
                      "process_model_outputs_median")


def read_vidur_overhead(hf_model: str, tp: int, *, root: Path):
    rel = "vidur/cpu_overheads/a100.csv"
    df = pd.read_csv(Path(root) / rel)
    df = df[(df["model_name"] == hf_model) & (df["tensor_parallel_degree"] == tp)]
    if df.empty:
        raise ValueError(f"{rel}: no rows for {hf_model} at TP {tp}")
    t = sum(df[c] for c in CPU_OVERHEAD_PARTS) * 1e-3
    rows = pd.DataFrame({"kind": "overhead", "num_requests": df["batch_size"].to_numpy(),
                         "time_s": t.to_numpy()})
    return rows, {"part": "overhead", "file": rel,
                  "rows": f"model_name == {hf_model}, tensor_parallel_degree == {tp}; "
                          f"time = {' + '.join(CPU_OVERHEAD_PARTS)}",
                  "n_rows": int(len(rows))}


# --------------------------------------------------------------- shipped profiles

@dataclass(frozen=True)
class PublishedProfile:
    """How one shipped profile is built from the published tables."""

    gpu: str                  # kvsim catalog name
    model: str                # kvsim catalog name
    tp: int
    vidur_gpu: str            # compute/<vidur_gpu>/
    vidur_model: str          # org/name of the op table (the same model where measured)
    network: str | None       # network/<network>/ (TP > 1)
    overhead_model: str       # cpu_overheads rows nearest this model ...
    overhead_tp: int          # ... and TP
    note: str = ""

    @property
    def name(self) -> str:
        return f"{self.gpu}_{self.model}_tp{self.tp}"


A100, H100 = "a100-80gb-sxm", "h100-sxm"
L7, L70, CL34 = "meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-70b-hf", \
    "codellama/CodeLlama-34b-Instruct-hf"
PUBLISHED: tuple[PublishedProfile, ...] = (
    *(PublishedProfile(A100, "llama-2-7b", tp, "a100", L7, "a100_dgx" if tp > 1 else None, L7, 1)
      for tp in (1, 2, 4)),
    *(PublishedProfile(A100, "llama-3-8b", tp, "a100", "meta-llama/Meta-Llama-3-8B",
                       "a100_dgx" if tp > 1 else None, L7, 1) for tp in (1, 2, 4)),
    *(PublishedProfile(A100, "llama-2-70b", tp, "a100", L70, "a100_dgx" if tp > 1 else None, L70, 4)
      for tp in (1, 2, 4, 8)),
    *(PublishedProfile(H100, "llama-2-7b", tp, "h100", L7, "h100_dgx" if tp > 1 else None, L7, 1)
      for tp in (1, 2)),
    *(PublishedProfile(H100, "llama-2-70b", tp, "h100", L70, "h100_dgx", L70, 4) for tp in (2, 4, 8)),
    PublishedProfile("a100-80gb-pcie", "yi-34b", 2, "a100", CL34, "a100_pairwise_nvlink", CL34, 2,
                     note="Yi-34B is not in Vidur's tables: linear-op coefficients (per FLOP and "
                          "per byte) from CodeLlama-34B at TP2 on A100, the nearest measured "
                          "shape; pairwise-NVLink all-reduce, as on the Sarathi-Serve testbed"),
)


_ATTENTION_FITS: dict = {}


def _attention_fit(a100, root: Path) -> dict:
    """The A100 attention fit, once per process and data folder (every shipped profile shares it)."""
    from kvsim.cost.features import rank_shapes
    from kvsim.cost.fit import fit_profile
    key = (a100.name, str(Path(root).resolve()))
    if key not in _ATTENTION_FITS:
        rows, model, tp, _ = read_vidur_attention(root=root)
        _ATTENTION_FITS[key] = fit_profile(rows, model=model, gpu=a100, tp=tp,
                                           attention_shapes=rank_shapes(model, tp))
    return _ATTENTION_FITS[key]


def build_published_profile(spec: PublishedProfile, load_model, load_gpu, *, root: Path) -> dict:
    """Fit one shipped profile from the Vidur tables (see the module docstring)."""
    from kvsim.cost.features import rank_shapes
    from kvsim.cost.fit import fit_profile
    from kvsim.cost.roofline import peak_flops

    target = load_model(spec.model)
    gpu = load_gpu(spec.gpu)
    a100 = load_gpu(A100)
    op_rows, op_model, src_ops = read_vidur_ops(spec.vidur_gpu, spec.vidur_model, spec.tp, root=root)
    attn_rows, attn_model, attn_tp, src_attn = read_vidur_attention(root=root)
    parts, sources = [op_rows], [src_ops]
    if spec.tp > 1 and spec.network:
        ar_rows, src_ar = read_vidur_allreduce(spec.network, spec.tp, root=root)
        parts.append(ar_rows)
        sources.append(src_ar)
    oh_rows, src_oh = read_vidur_overhead(spec.overhead_model, spec.overhead_tp, root=root)
    parts.append(oh_rows)
    sources += [src_oh, src_attn]

    # Attention is fitted where it was measured (A100, Llama-2-70B TP2 ranks);
    # another GPU gets the A100 coefficients scaled by its peak FLOP/s and HBM
    # bandwidth relative to the A100's (identity for the A100 itself).
    attn = _attention_fit(a100, root)
    flop_ratio = peak_flops(a100, 2) / peak_flops(gpu, 2)
    byte_ratio = a100.hbm_bandwidth_gbps / gpu.hbm_bandwidth_gbps
    description = spec.note
    if gpu.name != a100.name:
        description = (description + " " if description else "") + (
            f"Attention: Vidur's A100 table, coefficients scaled by peak FLOP/s "
            f"({flop_ratio:.3f}) and HBM bandwidth ({byte_ratio:.3f}) ratios to the A100; "
            f"its errors are those of the A100 fit.")
    profile = fit_profile(pd.concat(parts, ignore_index=True), model=op_model, gpu=gpu,
                          tp=spec.tp, name=spec.name, target_model=target, sources=sources,
                          description=description, require_attention=False)
    for part in ("prefill_attention", "decode_attention"):
        c = dict(attn[part])
        c["sec_per_flop"] = float(f"{c['sec_per_flop'] * flop_ratio:.6g}")
        c["sec_per_byte"] = float(f"{c['sec_per_byte'] * byte_ratio:.6g}")
        profile[part] = c
        profile["errors"][part] = attn["errors"][part]
        profile["heldout"][part] = attn["heldout"][part]
    return profile


# --------------------------------------------------------------- vLLM layer-wise tables

LAYERWISE_OPS = {
    "embedding": "embedding", "layernorm": "input_norm", "qkv_proj": "qkv_proj",
    "rotary_emb": "rope", "o_proj": "o_proj", "gate_up_proj": "mlp_gate_up",
    "act_fn": "mlp_act", "down_proj": "mlp_down", "final_layernorm": "final_norm",
    "lm_head": "lm_head", "sampler": "sampler",
}


def read_vllm_layerwise(gpu_dir: str, hf_model: str, tp: int = 1, *, root: Path):
    """LLMServingSim's vLLM 0.19 kernel tables (``llmservingsim/vllm_layerwise``) as calibration rows.

    ``layernorm`` is vLLM's fused residual-add + RMSNorm: it stands for both
    norms, and the residual adds cost nothing extra (a profile built from it
    sets ``residual_add`` to zero). Mixed prefill + decode attention rows
    become kind ``attention`` (validation of the separately fitted parts).
    """
    base = f"llmservingsim/vllm_layerwise/{gpu_dir}/{hf_model}/bf16/tp{tp}"
    folder = Path(root) / base
    dense = pd.read_csv(folder / "dense.csv")
    per_seq = pd.read_csv(folder / "per_sequence.csv").rename(columns={"sequences": "tokens"})
    ops = pd.concat([dense, per_seq], ignore_index=True)
    ops = ops[ops["layer"].isin(list(LAYERWISE_OPS))]
    op_rows = pd.DataFrame({"kind": "op", "op": ops["layer"].map(LAYERWISE_OPS).to_numpy(),
                            "num_tokens": ops["tokens"].to_numpy(),
                            "time_s": ops["time_us"].to_numpy() * 1e-6})
    norms = op_rows[op_rows["op"] == "input_norm"].assign(op="post_attn_norm")
    attn = pd.read_csv(folder / "attention.csv")
    pre = attn[(attn["n_decode"] == 0) & (attn["prefill_chunk"] > 0)]
    dec = attn[(attn["prefill_chunk"] == 0) & (attn["n_decode"] > 0)]
    mixed = attn[(attn["prefill_chunk"] > 0) & (attn["n_decode"] > 0)]
    mixed = mixed.iloc[:: max(1, len(mixed) // 2000)]        # a spread-out sample is plenty
    attn_rows = pd.concat([
        pd.DataFrame({"kind": "prefill_attention", "prefill_chunk": pre["prefill_chunk"],
                      "prefill_context": pre["kv_prefill"], "time_s": pre["time_us"] * 1e-6}),
        pd.DataFrame({"kind": "decode_attention", "num_decode": dec["n_decode"],
                      "decode_context": dec["kv_decode"], "time_s": dec["time_us"] * 1e-6}),
        pd.DataFrame({"kind": "attention", "prefill_chunk": mixed["prefill_chunk"],
                      "prefill_context": mixed["kv_prefill"], "num_decode": mixed["n_decode"],
                      "decode_context": mixed["kv_decode"], "time_s": mixed["time_us"] * 1e-6}),
    ], ignore_index=True)
    rows = pd.concat([op_rows, norms, attn_rows], ignore_index=True)
    rows = rows[rows["time_s"] > 0]
    source = {"part": "ops+attention", "file": base + "/{dense,per_sequence,attention}.csv",
              "rows": "pure prefill / pure decode fitted, mixed attention held out (sampled)",
              "n_rows": int(len(rows))}
    return rows, source
