"""A correct diffusion-style model whose forward draws from NumPy's global generator, as
openai/improved-diffusion's UniformSampler does (``np.random.choice`` for each sample's
timestep; the noise from torch's): given the same seed, every rank draws the same, so
node-health compares them bitwise like any other work."""

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

STEPS = 50


class TimestepDenoiser(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.time = nn.Embedding(STEPS, 8)
        self.net = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = torch.from_numpy(np.random.choice(STEPS, size=(x.shape[0],)))
        noisy = x + torch.randn_like(x) * (t[:, None] / STEPS)
        return self.net(noisy + self.time(t))


def build_model() -> nn.Module:
    return TimestepDenoiser()


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch_size, 8, generator=generator), torch.randn(batch_size, 8, generator=generator)


def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out, y)
