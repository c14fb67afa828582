"""Which kernel `scaled_dot_product_attention` picks for the graph engine's attention, logged at capture.

The graph engine always passes a padding mask (its buckets are padded), which rules out some fused kernels
(flash attention takes no arbitrary mask). Which one the dispatcher then picks (memory-efficient, cuDNN or the
unfused math path) decides much of the speed and is invisible otherwise. torch answers it only through an internal,
`torch._fused_sdp_choice`, the dispatcher's own choice function; it has been there since torch 2.0 and
tests/service/engines/test_sdpa.py checks that it still is. Without it the answer is "unknown", never a guess.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

UNKNOWN = "unknown"


def sdpa_backend(heads: int, length: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> str:
    """The backend name (e.g. "efficient_attention", "math") for one padded bucket length, batch 1."""
    choose = getattr(torch, "_fused_sdp_choice", None)
    if choose is None:
        return UNKNOWN
    try:
        from torch.nn.attention import SDPBackend

        q = torch.zeros(1, heads, length, head_dim, dtype=dtype, device=device)  # [1, heads, seq, head_dim]
        bias = torch.zeros(1, 1, 1, length, dtype=dtype, device=device)  # [1, 1, 1, seq]: the padding mask's shape
        name: str = SDPBackend(int(choose(q, q, q, bias, 0.0, False))).name
    except Exception:  # an internal: any change in it must cost a log word, never start-up
        return UNKNOWN
    return name.lower()


def sdpa_backends(heads: int, lengths: Iterable[int], head_dim: int, dtype: torch.dtype,
                  device: torch.device) -> str:
    """One line for the log: the backend, or each length's when they differ ("efficient_attention" or
    "16:math, 256:efficient_attention")."""
    chosen = {length: sdpa_backend(heads, length, head_dim, dtype, device) for length in sorted(set(lengths))}
    names = set(chosen.values())
    if len(names) == 1:
        return names.pop()
    return ", ".join(f"{length}:{name}" for length, name in chosen.items())
