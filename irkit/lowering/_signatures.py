"""Module call signatures go into the model, so outlining needs nothing but the model."""

from __future__ import annotations

import onnx_ir as ir

from irkit import metadata as md

__all__ = ["store_call_signatures"]


def store_call_signatures(model: ir.Model, signatures: md.CallSignatures) -> ir.Model:
    """Write ``signatures`` under :data:`irkit.metadata.CALL_SIGNATURES` (nothing if empty).

    Args:
        model: The lowered model; its ``metadata_props`` get the key.
        signatures: From ``Emitter.call_signatures()`` (ONNX value names, signature order).

    Returns:
        ``model`` itself.
    """
    if signatures:
        model.metadata_props[md.CALL_SIGNATURES] = md.encode_call_signatures(signatures)
    return model
