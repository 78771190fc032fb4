"""An ordinary training loop that reads the loss and the accuracy back with .item() at every step."""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
inputs, targets = torch.randn(512, 64), torch.randint(0, 10, (512,))
running_loss, correct = 0.0, 0
for step in range(24):
    x, y = inputs[step % 16 * 32:][:32], targets[step % 16 * 32:][:32]
    logits = model(x)
    loss = nn.functional.cross_entropy(logits, y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    running_loss += loss.item()
    correct += (logits.argmax(1) == y).sum().item()
print(f"mean loss {running_loss / 24:.3f}, accuracy {correct / (24 * 32):.2f}")
