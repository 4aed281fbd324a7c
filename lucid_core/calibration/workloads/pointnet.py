"""PointNet classifier (input and feature transforms) on generated 1,024-point clouds, 16 classes."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from lucid_core.calibration.workloads.loop import autocast, grad_scaler

POINTS, CLASSES = 1024, 16


def shared_mlp(*sizes: int) -> nn.Sequential:
    """Per-point MLP as 1x1 convolutions with batch norm."""
    layers: list[nn.Module] = []
    for cin, cout in itertools.pairwise(sizes):
        layers += [nn.Conv1d(cin, cout, 1), nn.BatchNorm1d(cout), nn.ReLU()]
    return nn.Sequential(*layers)


class TNet(nn.Module):
    """Predicts a k x k alignment matrix from the cloud itself."""

    def __init__(self, k: int) -> None:
        super().__init__()
        self.k = k
        self.features = shared_mlp(k, 64, 128, 1024)
        self.head = nn.Sequential(nn.Linear(1024, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                                  nn.Linear(256, k * k))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = self.features(x).amax(dim=2)
        eye = torch.eye(self.k, device=x.device, dtype=pooled.dtype).flatten()
        return (self.head(pooled) + eye).view(-1, self.k, self.k)


class PointNet(nn.Module):
    def __init__(self, classes: int = CLASSES) -> None:
        super().__init__()
        self.input_tnet, self.feature_tnet = TNet(3), TNet(64)
        self.mlp1 = shared_mlp(3, 64, 64)
        self.mlp2 = shared_mlp(64, 128, 1024)
        self.head = nn.Sequential(nn.Linear(1024, 512), nn.BatchNorm1d(512), nn.ReLU(), nn.Dropout(0.3),
                                  nn.Linear(512, 256), nn.BatchNorm1d(256), nn.ReLU(), nn.Linear(256, classes))

    def forward(self, points: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.bmm(self.input_tnet(points), points)
        x = self.mlp1(x)
        transform = self.feature_tnet(x)
        x = self.mlp2(torch.bmm(transform, x))
        return self.head(x.amax(dim=2)), transform


def build(batch_size: int, device: torch.device, amp: bool) -> Callable[[], torch.Tensor]:
    """One Adam step of classification loss plus the feature-transform orthogonality penalty."""
    model = PointNet().to(device).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = grad_scaler(device, amp)
    clouds = torch.randn(batch_size, 3, POINTS, device=device)
    labels = torch.randint(0, CLASSES, (batch_size,), device=device)
    eye = torch.eye(64, device=device)

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        with autocast(device, amp):
            logits, transform = model(clouds)
            t = transform.float()
            penalty = (torch.bmm(t, t.transpose(1, 2)) - eye).pow(2).sum(dim=(1, 2)).mean()
            loss = F.cross_entropy(logits.float(), labels) + 1e-3 * penalty
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss.detach()

    return step
