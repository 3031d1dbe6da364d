"""A DDP convnet with BatchNorm, fp16 autocast and GradScaler, for ``fit --nproc-per-node``:
8 blocks of 3x3 ``Conv2d``, ``BatchNorm2d`` and ``ReLU`` in one ``Sequential``, a linear
head, SGD with momentum, random 224x224 images (activations outweigh the parameters).

    gpu-mem-track fit --nproc-per-node 2 --batch-arg=--bs 8GiB:sm80 \\
        scripts/check/ddp_convnet_train.py --bs 64

Its figures are in ``reports/fit_distributed.md``. Runs as it is under ``torchrun`` on GPUs.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


class Net(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for _ in range(8):
            layers += [nn.Conv2d(channels, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(inplace=True)]
            channels = width
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(width, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.features(x)), 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bs", type=int, default=64, help="images per GPU per step")
    parser.add_argument("--width", type=int, default=256, help="channels of every convolution")
    parser.add_argument("--steps", type=int, default=4, help="training steps")
    args = parser.parse_args()
    dist.init_process_group("nccl")
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    model = DistributedDataParallel(Net(args.width).cuda(rank), device_ids=[rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda")
    for _ in range(args.steps):
        x = torch.randn(args.bs, 3, 224, 224, device="cuda")
        y = torch.randint(0, 1000, (args.bs,), device="cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
