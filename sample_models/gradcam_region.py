"""An image classifier built so that only one image region matters, for `torchdiag gradcam`.

The input (1×3×32×32 RGB) is multiplied by a fixed window that keeps only the bottom-right
quadrant (rows 16–31, columns 16–31) and zeroes the rest; two bias-free 3×3 convolutions with
ReLU follow, then global average pooling and a linear layer (classes k and k+1 have opposite
weights, so the predicted class always has positive evidence). Pixels outside the window
cannot change the output, so a correct Grad-CAM is zero there beyond the 2-pixel reach of the
two convolutions and peaks inside the window.

    torchdiag gradcam sample_models/gradcam_region.py:build --layer features.3 --image docs/images/sample_input.png --out cam.png
"""
import torch
from torch import nn

REGION = (slice(16, 32), slice(16, 32))   # rows, cols of the window that matters
REACH = 2                                  # pixels each side that two 3×3 convs can see


class Window(nn.Module):
    def __init__(self, size: int = 32):
        super().__init__()
        mask = torch.zeros(1, 1, size, size)
        mask[..., REGION[0], REGION[1]] = 1.0
        self.register_buffer("mask", mask)

    def forward(self, x):
        return x * self.mask


class RegionClassifier(nn.Module):
    def __init__(self, classes: int = 4, width: int = 8, size: int = 32):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.window = Window(size)
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1, bias=False), nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1, bias=False), nn.ReLU())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(width, classes, bias=False)
        with torch.no_grad():
            for m in (self.features[0], self.features[2]):
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) * 0.3)
            w = torch.randn(classes // 2, width, generator=g)
            self.head.weight.copy_(torch.cat([w, -w])[:classes] if classes % 2 == 0
                                   else torch.cat([w, -w, w[:1]])[:classes])

    def forward(self, x):
        return self.head(self.pool(self.features(self.window(x))).flatten(1))


def build(classes: int = 4) -> nn.Module:
    return RegionClassifier(classes)


def example_inputs():
    return (torch.rand(1, 3, 32, 32),)


def batch(n: int = 64):
    """(images, labels) for `torchdiag embeddings --batch`: a bright square in one of the four
    quadrants on a noisy background; the label is the quadrant (0 TL, 1 TR, 2 BL, 3 BR)."""
    g = torch.Generator().manual_seed(0)
    y = torch.arange(n) % 4
    x = torch.rand(n, 3, 32, 32, generator=g) * 0.3
    for i in range(n):
        r, c = divmod(int(y[i]), 2)
        x[i, :, 4 + 16 * r: 12 + 16 * r, 4 + 16 * c: 12 + 16 * c] += 0.7
    return x, y
