"""Published whole-step times of a real engine, used to fit and check the engine-time model.

Sarathi-Serve's OSDI'24 artifact (microsoft/sarathi-serve, MIT, commit
02d2567 "Add osdi experiments folder", 2024-06-04): Yi-34B (01-ai/Yi-34B-200K,
fp16) at TP2 on two A100-80GB PCIe bridged by NVLink, Azure NC96ads A100 v4,
the artifact's engine with Ray workers, eager PyTorch, FlashAttention
(``attention_backend: flash_attention`` in ``sarathi/benchmark/config/default.yml``).
``batch_execution_time`` medians, copied from:

* ``osdi-experiments/figure-2/prefill.csv``: one prompt of N tokens per batch;
* ``osdi-experiments/figure-2/decode.csv``: decode-only batches of B requests.
  ``operation_time_split_runs.sh`` makes every request 1,024 tokens with a
  prefill:decode ratio of 255 (1,020 prompt + 4 output tokens), so each
  decode reads about 1,021 cached tokens (not the "short contexts" the
  issue text assumed);
* ``osdi-experiments/table-2/results.csv``: the specimen batches of Table 2
  (prompts of 1,024 tokens, 16 output tokens): decode-only 4, prefill-only
  1,024, hybrid 1,021 prefill + 3 decode tokens.

``ISSUE_POINTS`` are the eight points the project checks against (issue #6's
list, reports/calibration.md); the other rows are what a fit may use
(``TRAIN_POINTS``), so that the check stays held out. One row is left out of
both: the 256-token prefill (121 ms, slower than the 512-token one at 106 ms
and the only row without an ``inter_batch_delay``: an outlier of the run).
"""

from __future__ import annotations

from dataclasses import dataclass

SOURCE = "microsoft/sarathi-serve@02d2567 osdi-experiments"
DECODE_CONTEXT = 1021      # tokens each decode attends to (1,020-token prompts)


@dataclass(frozen=True)
class StepPoint:
    """One measured engine step: per request, new tokens and cached tokens; seconds."""

    label: str
    num_new_tokens: tuple[int, ...]
    num_context_tokens: tuple[int, ...]
    measured_s: float
    source: str
    num_sampled: int | None = None     # None: every request samples a token

    @property
    def sampled(self) -> int:
        return len(self.num_new_tokens) if self.num_sampled is None else self.num_sampled

    @property
    def phase(self) -> str:
        decodes = sum(1 for n in self.num_new_tokens if n == 1)
        if decodes == len(self.num_new_tokens):
            return "decode"
        return "prefill" if decodes == 0 else "hybrid"


def _prefill(n: int, seconds: float, src: str = "figure-2/prefill.csv") -> StepPoint:
    return StepPoint(f"prefill {n:,}", (n,), (0,), seconds, src)


def _decode(b: int, seconds: float, ctx: int = DECODE_CONTEXT,
            src: str = "figure-2/decode.csv") -> StepPoint:
    return StepPoint(f"decode batch {b}", (1,) * b, (ctx,) * b, seconds, src)


SARATHI_YI34B_TP2 = {
    "prefill": tuple(_prefill(n, s) for n, s in (
        (128, 0.0480940844863653), (256, 0.1213533570989966), (512, 0.1055817436426878),
        (1024, 0.2143006371334195), (2048, 0.3660252727568149), (4096, 0.7576026394963264),
        (8192, 1.863264944404364), (16384, 4.407501052133739))),
    "decode": tuple(_decode(b, s) for b, s in (
        (1, 0.04680326674133536), (2, 0.04750242146352921), (4, 0.04884505489220215),
        (8, 0.06967552363251643), (16, 0.0772536892133454), (32, 0.08789650211110707),
        (64, 0.1278068584700425), (128, 0.18933050256843362))),
    "table2": (
        StepPoint("table 2: decode batch 4", (1,) * 4, (1032,) * 4, 0.06812209542840715,
                  "table-2/results.csv"),
        StepPoint("table 2: prefill 1,024", (1024,), (0,), 0.2172359591349959,
                  "table-2/results.csv"),
        # the chunk is 1,021 of a 1,024-token prompt: only the 3 decodes sample
        StepPoint("hybrid 1,021 prefill + 3 decode", (1021, 1, 1, 1), (0, 1032, 1032, 1032),
                  0.2176498775370419, "table-2/results.csv", num_sampled=3),
    ),
}

_ISSUE_LABELS = ("prefill 128", "prefill 1,024", "prefill 4,096", "prefill 8,192",
                 "prefill 16,384", "decode batch 1", "decode batch 128",
                 "hybrid 1,021 prefill + 3 decode")
_OUTLIERS = ("prefill 256",)
# Table 2's prefill-only 1,024 is another run of the held-out "prefill 1,024": not trained on.
_TOO_CLOSE = ("table 2: prefill 1,024",)


def all_points() -> tuple[StepPoint, ...]:
    return tuple(p for group in SARATHI_YI34B_TP2.values() for p in group)


ISSUE_POINTS = tuple(p for label in _ISSUE_LABELS for p in all_points() if p.label == label)
TRAIN_POINTS = tuple(p for p in all_points()
                     if p.label not in _ISSUE_LABELS + _OUTLIERS + _TOO_CLOSE)
