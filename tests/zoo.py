"""The public model zoo used by tests and benchmarks: small, random weights, no downloads.

Every entry is a :class:`ZooModel`: the eager module (eval mode), example inputs and the
``dynamic_shapes`` spec (or ``None``). :func:`export` runs ``torch.export.export`` on it and caches
the program per process, so a test that needs the program twice pays once — callers must not
mutate it (irkit never does; a test checks that).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

SEED = 0


@dataclasses.dataclass
class ZooModel:
    name: str
    module: nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    dynamic_shapes: Any = None

    def eager(self, *args: Any, **kwargs: Any) -> Any:
        with torch.no_grad():
            return self.module(*(args or self.args), **(kwargs or self.kwargs))


# --- hand-written models -----------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self, d_in: int = 16, d_hidden: int = 32, d_out: int = 8):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(d_hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.down = None
        if stride != 1 or c_in != c_out:
            self.down = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.down is None else self.down(x)
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + identity)


class SmallResNet(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU()
        )
        self.layer1 = nn.Sequential(BasicBlock(16, 16), BasicBlock(16, 16))
        self.layer2 = nn.Sequential(BasicBlock(16, 32, 2), BasicBlock(32, 32))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.layer2(self.layer1(self.stem(x)))
        return self.fc(torch.flatten(self.pool(y), 1))


class SelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        h = self.n_heads
        q = q.view(b, t, h, d // h).transpose(1, 2)
        k = k.view(b, t, h, d // h).transpose(1, 2)
        v = v.view(b, t, h, d // h).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // h)
        att = torch.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        return self.proj(y)


class FeedForward(nn.Module):
    def __init__(self, d_model: int):
        super().__init__()
        self.up = nn.Linear(d_model, 4 * d_model)
        self.act = nn.GELU()
        self.down = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


class PreLNBlock(nn.Module):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = SelfAttention(d_model, n_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = FeedForward(d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class PreLNStack(nn.Module):
    """The benchmark stack: pre-LN transformer blocks, d_model 64, 4 heads, GELU MLP."""

    def __init__(self, n_layers: int, d_model: int = 64, n_heads: int = 4):
        super().__init__()
        self.layers = nn.ModuleList(PreLNBlock(d_model, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.ln_f(x)


# --- builders ------------------------------------------------------------------------------------


def _seeded(fn: Callable[[], ZooModel]) -> Callable[[], ZooModel]:
    @functools.wraps(fn)
    def wrapper() -> ZooModel:
        torch.manual_seed(SEED)
        zm = fn()
        zm.module.eval()
        return zm

    return wrapper


@_seeded
def mlp() -> ZooModel:
    return ZooModel("mlp", MLP(), (torch.randn(4, 16),))


@_seeded
def cnn() -> ZooModel:
    model = SmallResNet()
    # Non-trivial running statistics so BatchNorm in eval mode is really exercised.
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
    return ZooModel("cnn", model, (torch.randn(2, 3, 16, 16),))


def prenorm_stack(n_layers: int) -> ZooModel:
    torch.manual_seed(SEED)
    model = PreLNStack(n_layers).eval()
    return ZooModel(f"stack{n_layers}", model, (torch.randn(2, 16, 64),))


_TINY = dict(hidden=64, layers=2, heads=4, vocab=128, positions=64)


def _ids(batch: int = 2, seq: int = 8) -> torch.Tensor:
    return torch.randint(0, _TINY["vocab"], (batch, seq))


@_seeded
def gpt2() -> ZooModel:
    from transformers import GPT2Config, GPT2Model

    cfg = GPT2Config(
        n_embd=_TINY["hidden"],
        n_layer=_TINY["layers"],
        n_head=_TINY["heads"],
        vocab_size=_TINY["vocab"],
        n_positions=_TINY["positions"],
        use_cache=False,
        bos_token_id=0,
        eos_token_id=0,
    )
    return ZooModel("gpt2", GPT2Model(cfg), (_ids(),))


@_seeded
def bert() -> ZooModel:
    from transformers import BertConfig, BertModel

    cfg = BertConfig(
        hidden_size=_TINY["hidden"],
        num_hidden_layers=_TINY["layers"],
        num_attention_heads=_TINY["heads"],
        intermediate_size=4 * _TINY["hidden"],
        vocab_size=_TINY["vocab"],
        max_position_embeddings=_TINY["positions"],
    )
    return ZooModel("bert", BertModel(cfg, add_pooling_layer=True), (_ids(),))


@_seeded
def llama() -> ZooModel:
    from transformers import LlamaConfig, LlamaModel

    cfg = LlamaConfig(
        hidden_size=_TINY["hidden"],
        num_hidden_layers=_TINY["layers"],
        num_attention_heads=_TINY["heads"],
        num_key_value_heads=2,
        intermediate_size=2 * _TINY["hidden"],
        vocab_size=_TINY["vocab"],
        max_position_embeddings=_TINY["positions"],
        use_cache=False,
    )
    return ZooModel("llama", LlamaModel(cfg), (_ids(),))


@_seeded
def gpt2_dynamic() -> ZooModel:
    zm = gpt2()
    batch, seq = torch.export.Dim("batch", max=64), torch.export.Dim("seq", max=64)
    zm.name = "gpt2_dynamic"
    zm.dynamic_shapes = ({0: batch, 1: seq},)
    return zm


@_seeded
def t5() -> ZooModel:
    """Encoder-decoder with in-place ops (``add_``) and decomposed ``aten.min.other``."""
    from transformers import T5Config, T5Model

    cfg = T5Config(
        d_model=_TINY["hidden"],
        d_ff=2 * _TINY["hidden"],
        num_layers=_TINY["layers"],
        num_heads=_TINY["heads"],
        d_kv=16,
        vocab_size=_TINY["vocab"],
        decoder_start_token_id=0,
        use_cache=False,
    )
    return ZooModel("t5", T5Model(cfg), (), {"input_ids": _ids(), "decoder_input_ids": _ids(2, 5)})


@_seeded
def vit() -> ZooModel:
    from transformers import ViTConfig, ViTModel

    cfg = ViTConfig(
        hidden_size=_TINY["hidden"],
        num_hidden_layers=_TINY["layers"],
        num_attention_heads=_TINY["heads"],
        intermediate_size=2 * _TINY["hidden"],
        image_size=32,
        patch_size=8,
    )
    return ZooModel("vit", ViTModel(cfg), (torch.randn(2, 3, 32, 32),))


@_seeded
def whisper() -> ZooModel:
    from transformers import WhisperConfig, WhisperModel

    cfg = WhisperConfig(
        d_model=_TINY["hidden"],
        encoder_layers=_TINY["layers"],
        decoder_layers=_TINY["layers"],
        encoder_attention_heads=_TINY["heads"],
        decoder_attention_heads=_TINY["heads"],
        encoder_ffn_dim=2 * _TINY["hidden"],
        decoder_ffn_dim=2 * _TINY["hidden"],
        num_mel_bins=16,
        max_source_positions=16,
        max_target_positions=32,
        vocab_size=_TINY["vocab"],
        use_cache=False,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=0,
        decoder_start_token_id=0,
    )
    return ZooModel(
        "whisper", WhisperModel(cfg), (torch.randn(1, 16, 32),), {"decoder_input_ids": _ids(1, 4)}
    )


@_seeded
def mistral() -> ZooModel:
    from transformers import MistralConfig, MistralModel

    cfg = MistralConfig(
        hidden_size=_TINY["hidden"],
        intermediate_size=2 * _TINY["hidden"],
        num_hidden_layers=_TINY["layers"],
        num_attention_heads=_TINY["heads"],
        num_key_value_heads=2,
        vocab_size=_TINY["vocab"],
        use_cache=False,
    )
    return ZooModel("mistral", MistralModel(cfg), (_ids(),))


MORE: dict[str, Callable[[], ZooModel]] = {
    "t5": t5,
    "vit": vit,
    "whisper": whisper,
    "mistral": mistral,
}

ZOO: dict[str, Callable[[], ZooModel]] = {
    "mlp": mlp,
    "cnn": cnn,
    "gpt2": gpt2,
    "bert": bert,
    "llama": llama,
}


@functools.cache
def load(name: str) -> ZooModel:
    """The zoo model ``name`` (``"stackN"`` for a pre-LN stack of N layers), built once."""
    if name.startswith("stack"):
        return prenorm_stack(int(name[len("stack") :]))
    if name == "gpt2_dynamic":
        return gpt2_dynamic()
    return ZOO[name]() if name in ZOO else MORE[name]()


@functools.cache
def export(name: str) -> torch.export.ExportedProgram:
    """``torch.export.export`` of zoo model ``name``, cached per process. Do not mutate it."""
    zm = load(name)
    with torch.no_grad():
        return torch.export.export(
            zm.module, zm.args, zm.kwargs or None, dynamic_shapes=zm.dynamic_shapes
        )
