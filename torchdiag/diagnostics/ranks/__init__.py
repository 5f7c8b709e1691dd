"""Under torchrun: the ranks' results merged into one (merge.py), the cross-rank consistency check of
parameters, buffers and reduced gradients (consistency.py), and the parameters that get no gradient
on a rank, which DDP cannot reduce (unused.py)."""
