"""A training loop whose loss turns NaN after a few steps (a learning rate far too high), and which exits 0."""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=1e6)
inputs, targets = torch.randn(64, 8), torch.randn(64, 1)
for step in range(12):
    x, y = inputs[step % 4 * 16:][:16], targets[step % 4 * 16:][:16]
    loss = nn.functional.mse_loss(model(x), y) * (float("nan") if step >= 6 else 1.0)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
print("done")
