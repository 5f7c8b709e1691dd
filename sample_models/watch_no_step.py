"""Bad input for watch: the script computes losses and gradients but never calls optimizer.step()."""
import torch
import torch.nn as nn

model = nn.Linear(4, 1)
for _ in range(5):
    model(torch.randn(8, 4)).pow(2).mean().backward()
