"""What the export kernels share: refusing what they cannot honour, the L2 normalization."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from irkit.errors import ExportError

__all__ = ["refuse", "l2norm"]

# keyword → why no export kernel can honour it (a value other than None/False is refused)
_PACKED = {
    "seq_idx": "packed sequences (seq_idx) are not supported",
    "cu_seqlens": "packed sequences (cu_seqlens) are not supported",
}


def refuse(
    contract: str, kwargs: Mapping[str, Any], extra: Mapping[str, str] | None = None
) -> None:
    """Raise for a keyword the kernel of ``contract`` cannot honour (packed sequences, ``extra``).

    Args:
        contract: The hub-kernel contract name (for the message).
        kwargs: The call's keyword arguments.
        extra: More refused keywords of this contract, each with why.

    Raises:
        ExportError: One of them is set (not None, not False).
    """
    for name, why in {**_PACKED, **(extra or {})}.items():
        value = kwargs.get(name)
        if value is not None and value is not False:
            raise ExportError(
                f"irkit export kernel {contract!r}: {why}; pass {name}=None (export one unpadded "
                "sequence per batch row, as irkit.llm does)"
            )


def l2norm(x: Any, eps: float = 1e-6, scale: float = 1.0) -> Any:
    """``scale · x / sqrt(Σ x² + eps)`` over the last axis (flash-linear-attention's form).

    Written as the RMS norm it equals, ``x · rsqrt(mean(x²) + eps/d) · w`` with ``w`` the
    ``d``-vector ``scale/√d``: ``irkit.optimize`` fuses it into one ``RMSNormalization``.
    """
    import torch

    d = x.shape[-1]
    weight = torch.full((d,), scale * d**-0.5, dtype=x.dtype, device=x.device)
    return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + eps / d) * weight
