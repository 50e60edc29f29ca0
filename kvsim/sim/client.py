"""When a request's tokens reach the client (the streamed response), not when the engine makes them.

The engine records, for every output token, the end of the step that
produced it (``Request.token_times``). Tokens of one engine output (one
step's tokens of a request: one token, or several under speculative
decoding, or a multi-step burst) share that time; the client receives each
output as one streamed message. ``vllm bench serve`` times messages, not
tokens (``vllm/benchmarks/lib/endpoint_request_func.py``: TTFT is the first
message, each later message adds one ITL, the latency is the last message),
so tokens that share a time are one message and add no inter-token gap
(``kvsim.scenario.simulate.itl_seconds``).

``stream_interval_times`` applies vLLM V1's ``--stream-interval``.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence


def stream_interval_times(token_times: Sequence[float], stream_interval: int) -> array:
    """Per-token times as the client sees them with ``stream_interval`` k.

    vLLM V1 (``vllm/v1/engine/output_processor.py``, ``RequestState.make_request_output``,
    DELTA mode, which streaming uses): with k > 1 an engine output is sent only
    when the request has finished, when nothing has been sent yet, or when at
    least k tokens are unsent (``num_output_tokens - sent_tokens_offset >= k``);
    an output that is not sent waits, and the next one sent carries its
    tokens. So the first token and the last are never delayed. With k = 1
    every output is sent.

    ``token_times`` holds one time per token, in order; consecutive equal
    times are one engine output. The request is taken to have finished with
    its last token (only completed requests are shown to the client this way).
    Returns an ``array('d')``, the type of ``Request.token_times``.
    """
    n = len(token_times)
    if stream_interval <= 1 or n <= 1:
        return array("d", token_times)
    out = array("d", token_times)
    sent = 0                     # sent_tokens_offset
    i = 0
    while i < n:
        t = token_times[i]
        j = i + 1
        while j < n and token_times[j] == t:
            j += 1                # tokens [i, j) are one engine output
        if j == n or sent == 0 or j - sent >= stream_interval:
            for m in range(sent, j):
                out[m] = t
            sent = j
        i = j
    return out
