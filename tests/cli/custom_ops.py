"""A ``torch.library`` custom op for ``irkit lower --import tests.cli.custom_ops``.

Loading a saved program that calls a custom op needs the op registered first: that is what
``--import`` is for. The op has no ONNX lowering; ``--decompose-custom-ops`` traces its Python code.
"""

from __future__ import annotations

import torch
from torch import nn


@torch.library.custom_op("irkit_cli_test::scaled_tanh", mutates_args=())
def scaled_tanh(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.tanh(x) * scale


@scaled_tanh.register_fake
def _(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.empty_like(x)


class UsesCustomOp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.irkit_cli_test.scaled_tanh(self.fc(x), 2.0)
