"""A DDP training script in the style of PyTorch's DDP tutorial, for ``fit --nproc-per-node``:
an MLP written as one ``Sequential`` of ``Linear`` layers among ``ReLU``s (no repeated
blocks of modules), a ``DistributedSampler`` over a 512-sample synthetic dataset, Adam.

    gpu-mem-track fit --nproc-per-node 4 --batch-arg=--batch-size A100-40GB \\
        scripts/check/ddp_mlp_train.py --batch-size 32 --width 20480

Its figures are in ``reports/fit_distributed.md``. Runs as it is under ``torchrun`` on GPUs.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=32, help="samples per GPU per step")
    parser.add_argument("--epochs", type=int, default=1, help="passes over the dataset")
    parser.add_argument("--width", type=int, default=8192, help="the hidden layers' width")
    parser.add_argument("--samples", type=int, default=512, help="the dataset's size")
    args = parser.parse_args()
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    hidden = [m for _ in range(6) for m in (nn.Linear(args.width, args.width), nn.ReLU())]
    model = nn.Sequential(nn.Linear(1024, args.width), nn.ReLU(), *hidden, nn.Linear(args.width, 10)).to(
        device
    )
    model = DistributedDataParallel(model, device_ids=[local_rank])
    data = TensorDataset(torch.randn(args.samples, 1024), torch.randint(0, 10, (args.samples,)))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    if dist.get_rank() == 0:
        print(f"peak allocated {torch.cuda.max_memory_allocated()} B")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
