"""NeuMF recommender (GMF + MLP towers) on generated implicit-feedback (user, item, click) triples."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from lucid_core.calibration.workloads.loop import autocast, grad_scaler

USERS, ITEMS = 6040, 3706  # MovieLens-1M sizes


class NeuMF(nn.Module):
    def __init__(self, users: int = USERS, items: int = ITEMS, factors: int = 64,
                 mlp: tuple[int, ...] = (256, 128, 64)) -> None:
        super().__init__()
        self.gmf_user, self.gmf_item = nn.Embedding(users, factors), nn.Embedding(items, factors)
        self.mlp_user, self.mlp_item = nn.Embedding(users, mlp[0] // 2), nn.Embedding(items, mlp[0] // 2)
        tower: list[nn.Module] = []
        for cin, cout in itertools.pairwise(mlp):
            tower += [nn.Linear(cin, cout), nn.ReLU()]
        self.tower = nn.Sequential(*tower)
        self.out = nn.Linear(factors + mlp[-1], 1)

    def forward(self, user: torch.Tensor, item: torch.Tensor) -> torch.Tensor:
        gmf = self.gmf_user(user) * self.gmf_item(item)
        deep = self.tower(torch.cat([self.mlp_user(user), self.mlp_item(item)], dim=1))
        return self.out(torch.cat([gmf, deep], dim=1)).squeeze(1)


def build(batch_size: int, device: torch.device, amp: bool) -> Callable[[], torch.Tensor]:
    """One Adam step of binary cross-entropy on a fresh generated batch of interactions."""
    model = NeuMF().to(device).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = grad_scaler(device, amp)
    generator = torch.Generator(device=device).manual_seed(0)

    def step() -> torch.Tensor:
        user = torch.randint(0, USERS, (batch_size,), device=device, generator=generator)
        item = torch.randint(0, ITEMS, (batch_size,), device=device, generator=generator)
        clicked = ((user + item) % 3 == 0).float()
        opt.zero_grad(set_to_none=True)
        with autocast(device, amp):
            logits = model(user, item)
        loss = F.binary_cross_entropy_with_logits(logits.float(), clicked)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss.detach()

    return step
