"""PPO-style reinforcement-learning loop: one env step per iteration, small-batch updates every rollout.

The environment is a generated LunarLander-sized MDP (8 observations, 4 actions) stepped on the
CPU with NumPy, as gym environments are; the policy acts one observation at a time on the device,
which is what makes RL jobs light, latency-bound GPU users.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical

OBS, ACTIONS, HORIZON, EPOCHS = 8, 4, 256, 4


class SyntheticEnv:
    """Linear dynamics with noise and a quadratic reward; episodes end after 200 steps."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.dynamics = self.rng.normal(0, 0.3, (ACTIONS, OBS, OBS)).astype(np.float32)
        self.state = np.zeros(OBS, dtype=np.float32)
        self.t = 0

    def reset(self) -> np.ndarray:
        self.state = self.rng.normal(0, 1, OBS).astype(np.float32)
        self.t = 0
        return self.state

    def step(self, action: int) -> tuple[np.ndarray, float, bool]:
        noise = self.rng.normal(0, 0.1, OBS).astype(np.float32)
        self.state = np.tanh(self.dynamics[action] @ self.state + noise)
        self.t += 1
        return self.state, float(-np.square(self.state).sum()), self.t >= 200


class ActorCritic(nn.Module):
    def __init__(self, hidden: int = 64) -> None:
        super().__init__()
        self.actor = nn.Sequential(nn.Linear(OBS, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                                   nn.Linear(hidden, ACTIONS))
        self.critic = nn.Sequential(nn.Linear(OBS, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                                    nn.Linear(hidden, 1))


def build(batch_size: int, device: torch.device, amp: bool) -> Callable[[], torch.Tensor]:
    """Each call: one action + env step; every HORIZON steps, EPOCHS of clipped PPO over minibatches."""
    if amp:
        raise ValueError("the PPO workload has no AMP variant")
    net = ActorCritic().to(device)
    opt = torch.optim.Adam(net.parameters(), lr=3e-4)
    env = SyntheticEnv()
    obs = env.reset()
    buffer: dict[str, list] = {"obs": [], "act": [], "logp": [], "rew": []}
    last_loss = torch.zeros((), device=device)

    def update() -> torch.Tensor:
        states = torch.as_tensor(np.stack(buffer["obs"]), device=device)
        actions = torch.as_tensor(buffer["act"], device=device)
        old_logp = torch.as_tensor(buffer["logp"], device=device)
        rewards = torch.as_tensor(buffer["rew"], device=device, dtype=torch.float32)
        returns = torch.flip(torch.cumsum(torch.flip(rewards, [0]), 0), [0]) / HORIZON
        loss = torch.zeros((), device=device)
        for _ in range(EPOCHS):
            for idx in torch.randperm(HORIZON, device=device).split(batch_size):
                dist = Categorical(logits=net.actor(states[idx]))
                value = net.critic(states[idx]).squeeze(1)
                advantage = (returns[idx] - value).detach()
                ratio = torch.exp(dist.log_prob(actions[idx]) - old_logp[idx])
                policy_loss = -torch.min(ratio * advantage, ratio.clamp(0.8, 1.2) * advantage).mean()
                loss = policy_loss + 0.5 * (returns[idx] - value).pow(2).mean() - 0.01 * dist.entropy().mean()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        for values in buffer.values():
            values.clear()
        return loss.detach()

    def step() -> torch.Tensor:
        nonlocal obs, last_loss
        with torch.no_grad():
            dist = Categorical(logits=net.actor(torch.as_tensor(obs, device=device).unsqueeze(0)))
            action = dist.sample()
            logp = dist.log_prob(action)
        act = int(action.item())
        buffer["obs"].append(obs)
        buffer["act"].append(act)
        buffer["logp"].append(float(logp.item()))
        obs, reward, done = env.step(act)
        buffer["rew"].append(reward)
        if done:
            obs = env.reset()
        if len(buffer["obs"]) == HORIZON:
            last_loss = update()
        return last_loss

    return step
