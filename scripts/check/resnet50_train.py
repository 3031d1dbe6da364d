"""A ResNet-50 AMP training loop in plain torch, as timm's ``benchmark.py --model resnet50
--bench train --amp -b 128`` runs it (the H200 recording ``timm-resnet50-amp``).

The layers are timm's ResNet-50 (``resnet.py``: a 7x7 stem, max pool, bottleneck blocks
3-4-6-3 with the stride on the 3x3 conv, in-place ReLUs, ``x += shortcut``, the "fast"
global pool ``x.mean((2, 3))``, a 1000-class head), in NCHW (the recording ran without
``--channels-last``: its stem input cast is 128x3x288x288 fp16 and no layout copies
appear). The step is timm's ``TrainBenchmarkRunner._step``: ``zero_grad()``, forward and
loss under ``torch.autocast("cuda", torch.float16)``, ``backward()``, SGD (timm's
``create_optimizer_v2(opt="sgd", lr=1e-4)``: momentum 0.9, Nesterov), with
``cudnn.benchmark`` on (set at the top of timm's ``benchmark.py``): 3 warm-up and 5
timed steps. Prints ``max_memory_allocated`` and ``max_memory_reserved`` at the end.

    python scripts/check/resnet50_train.py [--batch 128] [--size 288] [--steps 8]
"""

from __future__ import annotations

import argparse

import torch
from torch import nn


class Bottleneck(nn.Module):
    """timm's ResNet bottleneck: 1x1, 3x3 (strided), 1x1 (x4 channels) conv-BN layers."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        width = planes
        self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.act1 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.act2 = nn.ReLU(inplace=True)
        self.conv3 = nn.Conv2d(width, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.act3 = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x
        x = self.act1(self.bn1(self.conv1(x)))
        x = self.act2(self.bn2(self.conv2(x)))
        x = self.bn3(self.conv3(x))
        if self.downsample is not None:
            shortcut = self.downsample(shortcut)
        x += shortcut
        return self.act3(x)


class ResNet50(nn.Module):
    """timm's ``resnet50`` (25,557,032 parameters)."""

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.act1 = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        inplanes = 64
        stages = []
        for index, (planes, blocks) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3))):
            stride = 1 if index == 0 else 2
            downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes * 4, 1, stride, bias=False), nn.BatchNorm2d(planes * 4)
            )
            layers = [Bottleneck(inplanes, planes, stride, downsample)]
            inplanes = planes * 4
            layers += [Bottleneck(inplanes, planes) for _ in range(blocks - 1)]
            stages.append(nn.Sequential(*layers))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = nn.Linear(2048, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.act1(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(x.mean((2, 3)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--size", type=int, default=288)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()

    torch.backends.cudnn.benchmark = True
    model = ResNet50().to("cuda")
    model.train()
    loss_fn = nn.CrossEntropyLoss().to("cuda")
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9, nesterov=True)
    inputs = torch.randn(args.batch, 3, args.size, args.size, device="cuda")
    for _ in range(args.steps):
        optimizer.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16):
            output = model(inputs)
            target = torch.empty(output.shape[0], device="cuda", dtype=torch.long).random_(1000)
            loss_fn(output, target).backward()
        optimizer.step()
    print(f"max_memory_allocated {torch.cuda.max_memory_allocated()} B")
    print(f"max_memory_reserved {torch.cuda.max_memory_reserved()} B")


if __name__ == "__main__":
    main()
