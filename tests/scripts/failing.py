"""A script that fails in its own code after a few training steps."""
import torch
from torch import nn


def check_shapes(batch):
    if batch.shape[1] != 3:
        raise ValueError(f"expected 3 features, got {batch.shape[1]}")


model = nn.Linear(3, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    batch = torch.randn(4, 3 if step < 3 else 5)
    check_shapes(batch)
    model(batch).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
