"""Small example models, one per family, for the estimator, the batch-size finder and tests.

Each factory takes no required argument, so the CLI can name it directly
(``gpu_mem_track.examples:convnet``). Suggested inputs (batch first):

- ``convnet``, ``resnet``: images ``Nx3x32x32``
- ``mlp``: vectors ``Nx784``
- ``transformer``: sequences of embeddings ``Nx64x128`` (batch, tokens, features)
- ``lstm``: sequences ``Nx32x64`` (batch, steps, features)
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["EXAMPLE_INPUTS", "convnet", "lstm", "mlp", "resnet", "transformer"]

#: A working input shape per example at batch 1 (the first size is the batch).
EXAMPLE_INPUTS = {
    "convnet": (1, 3, 32, 32),
    "resnet": (1, 3, 32, 32),
    "mlp": (1, 784),
    "transformer": (1, 64, 128),
    "lstm": (1, 32, 64),
}


def convnet(num_classes: int = 10) -> nn.Module:
    """Two conv-ReLU-pool blocks and two linear layers (LeNet-style, for 3x32x32 images)."""
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 8 * 8, 256),
        nn.ReLU(),
        nn.Linear(256, num_classes),
    )


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 conv-BN layers and a shortcut (1x1 conv when shapes change)."""

    def __init__(self, inputs: int, outputs: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(outputs)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(outputs)
        self.shortcut = nn.Sequential()
        if stride != 1 or inputs != outputs:
            self.shortcut = nn.Sequential(
                nn.Conv2d(inputs, outputs, 1, stride, bias=False), nn.BatchNorm2d(outputs)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


def resnet(num_classes: int = 10, width: int = 32) -> nn.Module:
    """A ResNet-style network for 32x32 images: a stem, three stages of two basic blocks."""
    stages = []
    channels = width
    for index, out in enumerate((width, 2 * width, 4 * width)):
        stride = 1 if index == 0 else 2
        stages += [BasicBlock(channels, out, stride), BasicBlock(out, out)]
        channels = out
    return nn.Sequential(
        nn.Conv2d(3, width, 3, 1, 1, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        *stages,
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(channels, num_classes),
    )


def mlp(sizes: tuple[int, ...] = (784, 512, 256, 10)) -> nn.Module:
    """Linear layers of the given ``sizes`` with ReLU between them."""
    layers: list[nn.Module] = []
    for index, (inputs, outputs) in enumerate(zip(sizes, sizes[1:])):
        if index:
            layers.append(nn.ReLU())
        layers.append(nn.Linear(inputs, outputs))
    return nn.Sequential(*layers)


def transformer(d_model: int = 128, heads: int = 4, layers: int = 2) -> nn.Module:
    """A transformer encoder (``nn.TransformerEncoder``, batch first, no dropout)."""
    layer = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)


class LSTMRegressor(nn.Module):
    """A two-layer LSTM and a linear head on every step's output."""

    def __init__(self, features: int = 64, hidden: int = 128, outputs: int = 1) -> None:
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.head(out)


def lstm(features: int = 64, hidden: int = 128) -> nn.Module:
    """:class:`LSTMRegressor` for ``(batch, steps, features)`` inputs."""
    return LSTMRegressor(features, hidden)
