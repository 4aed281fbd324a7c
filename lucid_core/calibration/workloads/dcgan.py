"""DCGAN (64x64, nz=100, 64 feature maps) trained adversarially on generated LSUN-sized images."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from lucid_core.calibration.workloads.loop import autocast, grad_scaler

NZ, NF = 100, 64


def generator() -> nn.Module:
    layers: list[nn.Module] = [nn.ConvTranspose2d(NZ, NF * 8, 4, 1, 0, bias=False), nn.BatchNorm2d(NF * 8), nn.ReLU()]
    for mult in (8, 4, 2):
        layers += [nn.ConvTranspose2d(NF * mult, NF * mult // 2, 4, 2, 1, bias=False),
                   nn.BatchNorm2d(NF * mult // 2), nn.ReLU()]
    layers += [nn.ConvTranspose2d(NF, 3, 4, 2, 1, bias=False), nn.Tanh()]
    return nn.Sequential(*layers)


def discriminator() -> nn.Module:
    layers: list[nn.Module] = [nn.Conv2d(3, NF, 4, 2, 1, bias=False), nn.LeakyReLU(0.2)]
    for mult in (1, 2, 4):
        layers += [nn.Conv2d(NF * mult, NF * mult * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(NF * mult * 2),
                   nn.LeakyReLU(0.2)]
    layers += [nn.Conv2d(NF * 8, 1, 4, 1, 0, bias=False), nn.Flatten()]
    return nn.Sequential(*layers)


def build(batch_size: int, device: torch.device, amp: bool) -> Callable[[], torch.Tensor]:
    """One discriminator step then one generator step (Adam, non-saturating loss) on a fixed real batch."""
    net_g, net_d = generator().to(device).train(), discriminator().to(device).train()
    opt_g = torch.optim.Adam(net_g.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(net_d.parameters(), lr=2e-4, betas=(0.5, 0.999))
    scaler = grad_scaler(device, amp)
    real = torch.rand(batch_size, 3, 64, 64, device=device) * 2 - 1
    ones = torch.ones(batch_size, 1, device=device)
    zeros = torch.zeros(batch_size, 1, device=device)

    def step() -> torch.Tensor:
        noise = torch.randn(batch_size, NZ, 1, 1, device=device)
        opt_d.zero_grad(set_to_none=True)
        with autocast(device, amp):
            fake = net_g(noise)
            loss_d = (F.binary_cross_entropy_with_logits(net_d(real).float(), ones)
                      + F.binary_cross_entropy_with_logits(net_d(fake.detach()).float(), zeros))
        scaler.scale(loss_d).backward()
        scaler.step(opt_d)
        opt_g.zero_grad(set_to_none=True)
        with autocast(device, amp):
            loss_g = F.binary_cross_entropy_with_logits(net_d(fake).float(), ones)
        scaler.scale(loss_g).backward()
        scaler.step(opt_g)
        scaler.update()
        return loss_g.detach()

    return step
