"""A small decoder-only transformer language model (4 layers, d=256) on generated token streams."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from lucid_core.calibration.workloads.loop import autocast, grad_scaler

VOCAB = 8192
SEQ_LEN = 128


class TinyLM(nn.Module):
    def __init__(self, vocab: int = VOCAB, d_model: int = 256, layers: int = 4, heads: int = 4,
                 seq_len: int = SEQ_LEN) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(1, seq_len, d_model))
        block = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.1, batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq_len), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens) + self.pos[:, : tokens.shape[1]]
        x = self.blocks(x, mask=self.mask, is_causal=True)
        return self.head(self.norm(x))


def build(batch_size: int, device: torch.device, amp: bool) -> Callable[[], torch.Tensor]:
    """One AdamW step of next-token prediction on a fixed generated batch of sequences."""
    model = TinyLM().to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    scaler = grad_scaler(device, amp)
    tokens = torch.randint(0, VOCAB, (batch_size, SEQ_LEN + 1), device=device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        with autocast(device, amp):
            logits = model(inputs)
            loss = F.cross_entropy(logits.reshape(-1, VOCAB).float(), targets.reshape(-1))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss.detach()

    return step
