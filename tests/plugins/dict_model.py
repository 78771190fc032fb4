"""A tiny text classifier called the way transformers models are: keyword inputs, a dataclass output.

Options (--option KEY=VALUE):
  inputs=dict|tuple|tensor   dataset items' inputs: {"input_ids", "attention_mask"}, (ids, mask) or ids
  output=dataclass|dict|tuple|tensor   what forward returns (the dataclass and dict have .logits/["logits"])
  fail=build|dataset|forward|loss|type   plant an error in that piece of user code
  fail=nan   forward returns NaN logits (a diverged model)
"""
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

import perflab

VOCAB, LENGTH, WIDTH, CLASSES = 50, 8, 16, 3


@dataclass
class ClassifierOutput:
    """Like transformers' SequenceClassifierOutput: named fields, logits among them."""

    logits: torch.Tensor
    pooled: Optional[torch.Tensor] = None


class TinyTextClassifier(nn.Module):
    def __init__(self, output: str, fail: str):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.head = nn.Linear(WIDTH, CLASSES)
        self.output, self.fail = output, fail

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None):
        if self.fail == "forward":
            raise ValueError("planted failure in forward")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        mask = attention_mask.unsqueeze(-1).float()
        pooled = (self.embed(input_ids) * mask).sum(1) / mask.sum(1).clamp(min=1)
        logits = self.head(pooled)
        if self.fail == "nan":
            logits = logits * float("nan")
        if self.output == "dataclass":
            return ClassifierOutput(logits=logits, pooled=pooled)
        if self.output == "dict":
            return {"logits": logits, "pooled": pooled}
        if self.output == "tuple":
            return logits, pooled
        return logits


class Sentences(Dataset):
    def __init__(self, inputs: str, fail: str, size: int = 64):
        gen = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, VOCAB, (size, LENGTH), generator=gen)
        self.mask = (torch.rand(size, LENGTH, generator=gen) > 0.2).long()
        self.labels = torch.randint(0, CLASSES, (size,), generator=gen)
        self.inputs, self.fail = inputs, fail

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        if self.fail == "dataset":
            raise KeyError(f"planted failure loading item {index}")
        if self.inputs == "dict":
            return {"input_ids": self.ids[index], "attention_mask": self.mask[index]}, self.labels[index]
        if self.inputs == "tuple":
            return (self.ids[index], self.mask[index]), self.labels[index]
        return self.ids[index], self.labels[index]


def logits_of(output):
    if isinstance(output, dict):
        return output["logits"]
    if isinstance(output, tuple):
        return output[0]
    return getattr(output, "logits", output)


def classification_loss(output, target: torch.Tensor) -> torch.Tensor:
    if FAIL["loss"]:
        raise RuntimeError("planted failure in the loss")
    return F.cross_entropy(logits_of(output), target)


FAIL = {"loss": False}


def check_settings(options: dict) -> None:
    if options.get("fail") == "build":
        raise ValueError("planted failure in build")


def build(cfg):
    options = cfg.workload_options
    fail = options.get("fail", "")
    check_settings(options)
    FAIL["loss"] = fail == "loss"
    if fail == "type":
        return TinyTextClassifier("tensor", fail)
    output = options.get("output", "dataclass")
    return perflab.Workload(
        model=TinyTextClassifier(output, fail),
        dataset=Sentences(options.get("inputs", "dict"), fail),
        loss_fn=classification_loss,
        is_classifier=True,
        output_key=options.get("output_key"),
    )
