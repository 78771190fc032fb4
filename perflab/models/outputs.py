"""What a causal LM returned, whatever its library returns it as."""
from __future__ import annotations

from typing import Any

import torch

from perflab.errors import PerflabError


def output_field(output: Any, name: str, index: int) -> Any:
    """`name` of a ModelOutput / dataclass, a dict, or position `index` of a tuple."""
    if isinstance(output, dict) or hasattr(output, "keys"):
        if name in output:
            return output[name]
    if hasattr(output, name):
        return getattr(output, name)
    if isinstance(output, (tuple, list)) and len(output) > index:
        return output[index]
    if name == "logits" and isinstance(output, torch.Tensor):
        return output
    raise PerflabError(f"the causal LM returned {type(output).__name__} without {name!r}: return "
                       "logits and past_key_values (a dict, a ModelOutput, or a (logits, past) tuple)")
