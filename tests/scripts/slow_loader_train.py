"""An ordinary training script whose Dataset sleeps in __getitem__: the input pipeline is the bottleneck."""
import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SlowDataset(Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, index):
        time.sleep(0.002)  # decoding, augmentation... done one item at a time in the main process
        return torch.randn(32), index % 4


parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
args = parser.parse_args()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(SlowDataset(), batch_size=8)
for epoch in range(args.epochs):
    for inputs, targets in loader:
        loss = nn.functional.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
print(f"done: {args.epochs} epochs, last loss {loss.item():.3f}")
