"""Bug on one rank only, under torchrun (DDP, gloo): rank 1's optimizer was given the first layer alone,
so the head (2.weight, 2.bias) never trains there. Each rank watches its own run; rank 0 reports the
finding of rank 1, tagged with its rank. Run with
torchrun --standalone --nproc_per_node 2 -m torchdiag watch --every 10 -- python sample_models/watch_ddp_rank1.py"""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
    params = model.module[0].parameters() if rank == 1 else model.parameters()   # the bug, on rank 1 only
    opt = torch.optim.SGD(params, lr=0.05)
    g = torch.Generator().manual_seed(rank)
    for _ in range(30):
        x = torch.randn(8, 8, generator=g)
        loss = F.cross_entropy(model(x), (x[:, 0] > 0).long())
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"RANK {rank} done", flush=True)   # one write: the two ranks share stderr
    dist.destroy_process_group()   # as scripts do: watch hands its report over torchrun's store afterwards


if __name__ == "__main__":
    main()
