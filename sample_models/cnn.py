"""A small CNN for 32×32 RGB images (CIFAR-sized). Input: -i 8x3x32x32."""
from torch import nn


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 10, width: int = 16):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),            # 16x16
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),    # 8x8
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(2 * width * 8 * 8, classes))

    def forward(self, x):
        return self.head(self.features(x))


def build(classes: int = 10, width: int = 16) -> nn.Module:
    model = SmallCNN(classes, width)
    import torch

    model.example_input_array = torch.randn(8, 3, 32, 32)  # the Lightning convention
    return model
