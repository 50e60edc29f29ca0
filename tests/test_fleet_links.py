"""The KV-transfer links: catalog numbers re-derived from the measurements, and the time model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvsim.fleet.links import LinkPorts, LinkSpec, kv_bytes_per_stream, link_entry, list_links, load_link
from kvsim.specs.catalog import load_model

PROFILES = Path(__file__).resolve().parents[2] / "shared" / "data" / "profiles"


def _fit(size_bytes: np.ndarray, seconds: np.ndarray) -> tuple[float, float]:
    """(GB/s from the slope over messages >= 8 MiB, seconds of the smallest message)."""
    big = size_bytes >= 8 << 20
    slope, _ = np.polyfit(size_bytes[big], seconds[big], 1)
    return 1.0 / slope / 1e9, float(seconds[np.argmin(size_bytes)])


@pytest.mark.skipif(not PROFILES.is_dir(), reason="needs ../shared/data/profiles")
@pytest.mark.parametrize("link, node, devices_per_node", [
    ("nvlink-h100", "h100_dgx", 2), ("nvlink-a100", "a100_dgx", 2),
    ("infiniband-ndr", "h100_dgx", 1), ("infiniband-hdr", "a100_dgx", 1)])
def test_catalog_links_match_vidurs_nccl_send_recv_measurements(link, node, devices_per_node):
    d = pd.read_csv(PROFILES / "vidur" / "network" / node / "send_recv.csv")
    d = d[d.devices_per_node == devices_per_node]
    bw, small = _fit(d["size"].to_numpy(float), d["time_stats.send_recv.median"].to_numpy() / 1e3)
    spec = load_link(link)
    assert spec.bandwidth_gbps == pytest.approx(bw, rel=0.01)
    assert spec.latency_s == pytest.approx(small, rel=0.01)


@pytest.mark.skipif(not PROFILES.is_dir(), reason="needs ../shared/data/profiles")
def test_nvlink_agrees_with_apex_plus_sendrecv_on_h100():
    d = pd.read_csv(PROFILES / "apex_plus" / "comm" / "H100-SXM-80GB" / "sendrecv.csv")
    d = d[d.dtype == "half"]
    bw, _ = _fit(d["size(kb)"].to_numpy(float) * 1024, d["time(us)"].to_numpy() / 1e6)
    assert bw == pytest.approx(load_link("nvlink").bandwidth_gbps, rel=0.05)


def test_roce_entries_are_mooncakes_published_bandwidth_per_nic():
    assert load_link("roce-400g").bandwidth_gbps == pytest.approx(190 / 8)
    assert load_link("roce-200g").bandwidth_gbps == pytest.approx(87 / 4)
    assert load_link("tcp").bandwidth_gbps == pytest.approx(190 / 4.6 / 8, rel=0.01)


def test_every_entry_names_its_source_and_what_it_assumes():
    for name in list_links():
        entry = link_entry(name)
        assert len(entry["source"]) > 40
        assert set(entry.get("assumed", [])) <= {"latency_s", "bandwidth_gbps"}
        assert entry["scope"] in ("intra_node", "inter_node")


def test_aliases_and_mappings_load():
    assert load_link("RDMA").name == "roce-400g"
    assert load_link({"bandwidth_gbps": 10, "latency_s": 1e-5}) == LinkSpec("custom-link", 10.0, 1e-5)
    with pytest.raises(ValueError, match="unknown link 'warp'"):
        load_link("warp")
    with pytest.raises(ValueError, match="bandwidth_gbps must be > 0"):
        LinkSpec("x", 0.0, 0.0)


def test_transfer_time_is_latency_plus_bytes_over_bandwidth():
    link = LinkSpec("x", bandwidth_gbps=50.0, latency_s=1e-5)
    assert link.transfer_time_s(0) == 0.0
    assert link.transfer_time_s(50_000_000) == pytest.approx(1e-5 + 1e-3)


def test_sharded_kv_moves_over_the_smaller_tp_in_parallel():
    model = load_model("llama-3.1-8b")
    per_rank_tp2 = model.kv_bytes_per_block(16, "auto", 2)        # 64 KiB: 32 layers x 4 kv heads ...
    assert per_rank_tp2 * 2 == model.kv_bytes_per_block(16, "auto", 1)
    # 100 blocks of the whole model's KV = 100 * 131072 bytes; TP2 -> TP4: two pairs at once.
    assert kv_bytes_per_stream(100, per_rank_tp2, 2, 4) == 100 * per_rank_tp2
    assert kv_bytes_per_stream(100, per_rank_tp2, 2, 1) == 200 * per_rank_tp2
    # Replicated (MLA) KV: each decode rank pulls one whole copy.
    assert kv_bytes_per_stream(100, 1000, 4, 2, replicated=True) == 100_000


def test_llama_8b_prompt_of_4k_tokens_over_roce_takes_about_22_ms():
    model = load_model("llama-3.1-8b")
    nbytes = kv_bytes_per_stream(256, model.kv_bytes_per_block(16, "auto", 1), 1, 1)
    assert nbytes == 256 * 16 * 131072                            # 128 KiB per token in bf16
    assert load_link("roce-400g").transfer_time_s(nbytes) == pytest.approx(2e-6 + nbytes / 23.75e9)
    assert 0.022 < load_link("roce-400g").transfer_time_s(nbytes) < 0.023


def test_transfers_sharing_a_port_queue_first_come_first_served():
    ports = LinkPorts()
    assert ports.reserve("p0", "d0", 1.0, 0.5) == (1.0, 1.5)
    assert ports.reserve("p0", "d1", 1.2, 0.5) == (1.5, 2.0)      # p0 busy until 1.5
    assert ports.reserve("p1", "d1", 1.3, 0.1) == (2.0, 2.1)      # d1 busy until 2.0
    assert ports.reserve("p2", "d2", 1.25, 0.5) == (1.25, 1.75)   # free ports start at once
    assert ports.free_at("d1") == 2.1
