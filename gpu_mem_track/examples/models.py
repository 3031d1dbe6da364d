"""Models for demos and tests, with the same structure as torchvision's.

``vgg19()`` builds VGG-19 with the layer layout, parameter names and parameter count of
``torchvision.models.vgg19()`` (143,667,240 parameters), so the demo runs where
torchvision is not importable.
"""

from __future__ import annotations

from torch import nn

__all__ = ["VGG19_CONFIG", "load_vgg19", "vgg19"]

#: Output channels of each 3x3 convolution; "M" is a 2x2 max-pool.
VGG19_CONFIG = (
    64,
    64,
    "M",
    128,
    128,
    "M",
    256,
    256,
    256,
    256,
    "M",
    512,
    512,
    512,
    512,
    "M",
    512,
    512,
    512,
    512,
    "M",
)


class VGG(nn.Module):
    """VGG: ``features`` (convolutions), ``avgpool`` (to 7x7), ``classifier`` (3 linear layers)."""

    def __init__(self, features: nn.Sequential, num_classes: int = 1000) -> None:
        super().__init__()
        self.features = features
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096),
            nn.ReLU(True),
            nn.Dropout(),
            nn.Linear(4096, 4096),
            nn.ReLU(True),
            nn.Dropout(),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x):  # noqa: ANN001, ANN201
        x = self.avgpool(self.features(x))
        return self.classifier(x.flatten(1))


def vgg19(num_classes: int = 1000) -> VGG:
    """VGG-19 without batch norm, randomly initialised."""
    layers: list[nn.Module] = []
    channels = 3
    for item in VGG19_CONFIG:
        if item == "M":
            layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
        else:
            layers += [nn.Conv2d(channels, int(item), kernel_size=3, padding=1), nn.ReLU(inplace=True)]
            channels = int(item)
    return VGG(nn.Sequential(*layers), num_classes)


def load_vgg19() -> tuple[nn.Module, str]:
    """torchvision's VGG-19 when torchvision imports, else ``vgg19()``; with which one it was."""
    try:
        from torchvision.models import vgg19 as torchvision_vgg19  # type: ignore[import-not-found]

        return torchvision_vgg19(), "torchvision.models.vgg19"
    except Exception:  # torchvision missing, or built for another torch
        return vgg19(), "gpu_mem_track.examples.models.vgg19 (torchvision not importable)"
