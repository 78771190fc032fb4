"""A training loop that never ends on its own: stopped with Ctrl-C. Says 'training' once it has run some steps."""
import torch
from torch import nn

model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
step = 0
while True:
    x = torch.randn(8, 16)
    model(x).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    step += 1
    if step == 20:
        print("training", flush=True)
