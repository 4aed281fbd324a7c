"""Word-level LSTM language model (2 layers, 650 units, Wikitext-2-sized vocabulary) on generated tokens."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from lucid_core.calibration.workloads.loop import autocast, grad_scaler

VOCAB = 33278  # Wikitext-2 vocabulary size
BPTT = 35


class WordLSTM(nn.Module):
    def __init__(self, vocab: int = VOCAB, size: int = 650, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, size)
        self.rnn = nn.LSTM(size, size, layers, dropout=0.5, batch_first=False)
        self.drop = nn.Dropout(0.5)
        self.decoder = nn.Linear(size, vocab)
        self.decoder.weight = self.embed.weight  # tied weights, as in the classic example

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.drop(self.embed(tokens)))
        return self.decoder(self.drop(out))


def build(batch_size: int, device: torch.device, amp: bool) -> Callable[[], torch.Tensor]:
    """One clipped-SGD step over a BPTT window of a fixed generated token stream."""
    model = WordLSTM().to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=20.0)
    scaler = grad_scaler(device, amp)
    stream = torch.randint(0, VOCAB, (BPTT + 1, batch_size), device=device)
    inputs, targets = stream[:-1], stream[1:]

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        with autocast(device, amp):
            logits = model(inputs)
            loss = F.cross_entropy(logits.reshape(-1, VOCAB).float(), targets.reshape(-1))
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        scaler.step(opt)
        scaler.update()
        return loss.detach()

    return step
