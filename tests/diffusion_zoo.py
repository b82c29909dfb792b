"""The diffusion zoo: diffusers transformers that irkit's rewrite rules must not misread.

Tiny configurations (2 layers, 2 heads of 8, 8×8 latents, random weights, seed 0, nothing
downloaded) of real diffusers classes, exported the way users export them — keyword inputs,
``torch.export.export(model.eval(), (), inputs, dynamic_shapes=...)`` with a dynamic ``batch``,
no outer ``torch.no_grad()`` — with inputs at a second batch size. Same :class:`ArchModel`
structure as :mod:`tests.arch_zoo`.

- ``sd3``: ``SD3Transformer2DModel`` — joint attention concatenates image and text keys/values
  (once read as a KV cache by ``irkit.optimize``);
- ``sd35``: the same class as SD3.5 configures it (``qk_norm="rms_norm"``, a dual-attention
  layer);
- ``pixart``: ``PixArtTransformer2DModel`` — ``squeeze(1)`` on a dim of 16 tokens (a no-op in
  torch, once a ``Squeeze`` onnxruntime refused).

Programs are cached per process (:func:`export`); callers must not mutate them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from tests.arch_zoo import ArchModel, _gen, _seeded

LATENT = 8  # latent height and width
CHANNELS = 4
TEXT_TOKENS = 5
TEXT_DIM = 16
BATCHES = (2, 3)  # the export size, and a second one


def _latents(batch: int, tag: int) -> torch.Tensor:
    return torch.randn(batch, CHANNELS, LATENT, LATENT, generator=_gen(tag))


def _text(batch: int, tag: int) -> torch.Tensor:
    return torch.randn(batch, TEXT_TOKENS, TEXT_DIM, generator=_gen(100 + tag))


def _case(
    name: str, module: torch.nn.Module, make: Callable[[int, int], dict[str, Any]]
) -> ArchModel:
    batch = torch.export.Dim("batch", max=64)
    inputs = make(BATCHES[0], 0)
    dyn = {key: ({0: batch} if isinstance(v, torch.Tensor) else None) for key, v in inputs.items()}
    return ArchModel(name, "diffusion", module, inputs, make(BATCHES[1], 1), dyn)


def _sd3(**overrides: Any) -> ArchModel:
    from diffusers import SD3Transformer2DModel

    module = SD3Transformer2DModel(
        sample_size=LATENT,
        patch_size=2,
        in_channels=CHANNELS,
        out_channels=CHANNELS,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=TEXT_DIM,
        caption_projection_dim=16,
        pooled_projection_dim=8,
        pos_embed_max_size=16,
        **overrides,
    )

    def make(b: int, tag: int) -> dict[str, Any]:
        return {
            "hidden_states": _latents(b, tag),
            "encoder_hidden_states": _text(b, tag),
            "pooled_projections": torch.randn(b, 8, generator=_gen(200 + tag)),
            "timestep": torch.rand(b, generator=_gen(300 + tag)) * 1000,
            "return_dict": False,
        }

    name = "sd35" if overrides else "sd3"
    return _case(name, module, make)


@_seeded
def sd3() -> ArchModel:
    return _sd3()


@_seeded
def sd35() -> ArchModel:
    return _sd3(qk_norm="rms_norm", dual_attention_layers=(0,))


@_seeded
def pixart() -> ArchModel:
    from diffusers import PixArtTransformer2DModel

    module = PixArtTransformer2DModel(
        sample_size=LATENT,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=2,
        in_channels=CHANNELS,
        out_channels=2 * CHANNELS,  # PixArt predicts noise and variance
        cross_attention_dim=16,
        caption_channels=TEXT_DIM,
        patch_size=2,
        norm_num_groups=1,
        use_additional_conditions=False,
    )

    def make(b: int, tag: int) -> dict[str, Any]:
        return {
            "hidden_states": _latents(b, tag),
            "encoder_hidden_states": _text(b, tag),
            "timestep": torch.randint(0, 1000, (b,), generator=_gen(300 + tag)),
            "return_dict": False,
        }

    return _case("pixart", module, make)


DIFFUSION_ZOO: dict[str, Callable[[], ArchModel]] = {fn.__name__: fn for fn in (sd3, sd35, pixart)}


@functools.cache
def load(name: str) -> ArchModel:
    """The zoo entry ``name``, built once per process."""
    return DIFFUSION_ZOO[name]()


@functools.cache
def export(name: str) -> torch.export.ExportedProgram:
    """Export entry ``name`` as users do, cached per process. Do not mutate the result."""
    zm = load(name)
    return torch.export.export(zm.module.eval(), (), zm.inputs, dynamic_shapes=zm.dynamic_shapes)


@functools.cache
def expected_outputs(name: str, size: int) -> tuple[Any, ...]:
    """Eager outputs of entry ``name`` at size 0 or 1, flattened (numpy; do not mutate)."""
    zm = load(name)
    with torch.no_grad():
        out = zm.module(**zm.sizes()[size])
    leaves, _ = torch.utils._pytree.tree_flatten(out)
    return tuple(leaf.detach().numpy() for leaf in leaves if isinstance(leaf, torch.Tensor))
