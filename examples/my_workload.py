"""A user workload: `perflab run --workload examples/my_workload.py:build`."""
import torch
from torch import nn
from torch.utils.data import TensorDataset

import perflab


def build(cfg) -> perflab.Workload:
    # cfg is the run's RunConfig: cfg.batch_size, cfg.mode, cfg.device ("cuda"/"cpu") are resolved.
    width = 256 if cfg.device == "cuda" else 64
    gen = torch.Generator().manual_seed(cfg.seed)
    inputs = torch.randn(1024, 32, generator=gen)
    targets = torch.randint(0, 4, (1024,), generator=gen)
    model = nn.Sequential(nn.Linear(32, width), nn.GELU(), nn.Linear(width, 4))
    return perflab.Workload(
        name="my-classifier",  # optional: defaults to the file's stem, "my_workload"
        model=model,
        dataset=TensorDataset(inputs, targets),  # items are (input, target)
        loss_fn=nn.CrossEntropyLoss(),  # loss_fn(output, target), used in --mode train
        optimizer_factory=lambda params: torch.optim.AdamW(params, lr=1e-3),  # optional
        is_classifier=True,  # lets the quality gate compare top-1 agreement
    )
