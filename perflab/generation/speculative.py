"""Speculative decoding (greedy): a draft proposes K tokens, the target checks all of them in one forward.

The target keeps the longest prefix of the proposals that matches its own greedy choices, then adds its own
next token, so every round emits 1 to K+1 tokens and the output is exactly the target's greedy output. Both
caches roll back past rejected proposals. Each round reads the accepted count on the host (it decides the next
positions): one synchronisation per round, as in gpt-fast.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from perflab.generation.decode import NULL_TIMER, greedy
from perflab.profile.markers import no_mark


@dataclass
class SpeculativeStats:
    """Counts over the rounds of a run (decode phase only; the prefill's first token is not a round)."""

    rounds: int = 0
    proposed: int = 0
    accepted: int = 0
    emitted: int = 0

    def reset(self) -> None:
        self.rounds = self.proposed = self.accepted = self.emitted = 0

    def summary(self, k: int) -> dict[str, Any]:
        return {"k": k, "rounds": self.rounds, "proposed_tokens": self.proposed, "accepted_tokens": self.accepted,
                "acceptance_rate": self.accepted / self.proposed if self.proposed else None,
                "tokens_per_target_forward": self.emitted / self.rounds if self.rounds else None}


def generate_speculative(target, draft, prompt: torch.Tensor, new_tokens: int, k: int,
                         stats: Optional[SpeculativeStats] = None, clock: Optional[Any] = None,
                         timer: Any = NULL_TIMER, mark: type = no_mark) -> torch.Tensor:
    """The target's greedy continuation of `prompt`, `new_tokens` long, drafted `k` tokens at a time."""
    if clock is not None:
        clock.begin(prompt.shape[0], prompt.shape[1])
    with timer.phase("prefill"), mark("prefill"):
        token = greedy(target.start(prompt))
        draft.start(prompt)
        pieces, produced = [token], 1
        if clock is not None:
            clock.emit(1)
    with timer.phase("decode"), mark("decode"):
        while produced < new_tokens:
            if clock is not None:
                clock.step_begins()
            emitted, accepted = _round(target, draft, token, k)
            take = min(accepted + 1, new_tokens - produced)
            pieces.append(emitted[:, :take])
            produced += take
            token = emitted[:, accepted:accepted + 1]
            if stats is not None:
                stats.rounds += 1
                stats.proposed += k
                stats.accepted += accepted
                stats.emitted += accepted + 1
            if clock is not None:
                clock.emit(take)
    return torch.cat(pieces, dim=1)[:, :new_tokens]


def _round(target, draft, token: torch.Tensor, k: int) -> tuple[torch.Tensor, int]:
    """One round: (the accepted proposals plus the target's own next token, how many proposals were accepted)."""
    target_length, draft_length = target.length, draft.length
    proposals = []
    proposal = token
    for _ in range(k):
        # a compiled step's output lives until its next call: keep a copy of each proposal
        proposal = draft.extend_greedy(proposal)[:, -1:].clone()
        proposals.append(proposal)
    drafted = torch.cat(proposals, dim=1)
    predicted = target.extend_greedy(torch.cat([token, drafted], dim=1)).clone()  # (batch, k + 1)
    # every row of the batch must agree: the batch accepts the shortest matching prefix
    matching = (drafted == predicted[:, :k]).long().cumprod(dim=1).sum(dim=1).min()
    accepted = int(matching)  # the host sync of the round
    target.truncate(target_length + 1 + accepted)
    if accepted == k:
        draft.extend(drafted[:, -1:])  # the draft has not seen its own last proposal yet
    else:
        draft.truncate(draft_length + 1 + accepted)
    emitted = torch.cat([drafted[:, :accepted], predicted[:, accepted:accepted + 1]], dim=1)
    return emitted, accepted
