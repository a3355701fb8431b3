"""ResNet classifiers for the training example and the data-stall benchmark (nothing downloaded).

``resnet18`` / ``resnet50`` follow He et al. (torchvision's layout); ``resnet_small`` is a
four-stage ResNet of basic blocks at a quarter of the width, for CPU runs on small images.
"""

from __future__ import annotations

from torch import Tensor, nn


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _shortcut(inplanes, planes * self.expansion, stride)

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + (self.downsample(x) if self.downsample is not None else x))


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3, 1x1 expand (x4), with a residual connection."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _shortcut(inplanes, planes * 4, stride)

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + (self.downsample(x) if self.downsample is not None else x))


def _shortcut(inplanes: int, outplanes: int, stride: int) -> nn.Module | None:
    if stride == 1 and inplanes == outplanes:
        return None
    return nn.Sequential(nn.Conv2d(inplanes, outplanes, 1, stride, bias=False), nn.BatchNorm2d(outplanes))


class ResNet(nn.Module):
    """Stem, four stages of residual blocks, global average pooling, a linear classifier."""

    def __init__(self, block: type[BasicBlock] | type[Bottleneck], layers: list[int], num_classes: int, width: int = 64) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)
        )
        stages, inplanes = [], width
        for i, blocks in enumerate(layers):
            planes = width * 2**i
            for j in range(blocks):
                stages.append(block(inplanes, planes, 2 if (j == 0 and i > 0) else 1))
                inplanes = planes * block.expansion
        self.stages = nn.Sequential(*stages)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(inplanes, num_classes))

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.stages(self.stem(x)))


MODELS = {
    "resnet_small": lambda n: ResNet(BasicBlock, [1, 1, 1, 1], n, width=16),
    "resnet18": lambda n: ResNet(BasicBlock, [2, 2, 2, 2], n),
    "resnet50": lambda n: ResNet(Bottleneck, [3, 4, 6, 3], n),
}


def build_model(name: str, num_classes: int) -> nn.Module:
    """One of ``MODELS`` with ``num_classes`` outputs."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; expected one of {sorted(MODELS)}")
    return MODELS[name](num_classes)
