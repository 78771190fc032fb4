"""The order of a round's screens: the big one-flag levers the findings named, then the levers of a finding that
explains a large share of the step, then the other big ones whether or not the diagnosis names them (INSURANCE: a
short screen is cheap next to an 11x that a bandwidth-bound model gets from --compile alone), then the findings'
other levers, then the rest; tune's ordering rules (perflab/tune/ordering.py) apply within each group. Also what a
candidate still to screen may give (the winner-first rule in perflab/tune/screening.py reads it).
"""
from __future__ import annotations

from typing import Any

from perflab.config import RunConfig
from perflab.levers import all_levers
from perflab.tune import candidates as search
from perflab.tune import ordering

# The big one-flag levers: screened whenever they apply, named by the diagnosis or not (largest gains seen:
# compile 11.4x on a bandwidth-bound model, CUDA graphs 9.1x on a launch-bound step, bf16 + channels-last,
# DataLoader workers 4-6x on a loader-bound one).
# The levers that declare themselves screened whatever the diagnosis says (TuneHints.screen_always), in their order.
INSURANCE = tuple(lever.name for lever in sorted((lever for lever in all_levers() if lever.tune.screen_always),
                                                  key=lambda lever: lever.tune.screen_always))
# A finding that explains this share of the step (+25% if it were removed) has the levers it named screened before
# the insurance it did not name: on 2 GPUs (19 s a trial) a step waiting 37% of its time on all-reduces had its
# 150 s spent on bf16, compile and CUDA graphs, and the bucket size and the bf16 hook were never reached.
BIG_FINDING_SHARE_PCT = 20.0
WIDER_SOURCE = "wider search (nothing the diagnosis proposed won)"
INSURANCE_SOURCE = "insurance (a big one-flag lever, screened whether or not the diagnosis names it)"
CUT_PROFILE_SOURCE = "insurance (the profile was cut at its limit: no diagnosis)"
# A candidate the diagnosis gives no predicted gain (an insurance lever it does not name, the wider search) counts as
# able to double the throughput: a screened win above that, and above every other prediction left, is confirmed
# before those candidates are screened (compile screened +787% on a chain of 360 elementwise ops, and the budget
# then went to screening fp16 and left 2 s for a confirmation that needed 31 s).
UNPREDICTED_GAIN_PCT = 100.0


def screening_order(proposals: list[search.Proposal], levers_by_name: dict[str, Any], best: RunConfig
                    ) -> list[search.Proposal]:
    """The big levers the findings named, then the levers named by a finding that explains a large share of
    the step (BIG_FINDING_SHARE_PCT), then the other INSURANCE levers, then the findings' other levers, then the
    rest; tune's ordering rules (layout after precision, ...) apply within each group. Compile is not put behind
    the cheap levers here, as in a one-stage search: its screen costs one measured compile, and it is a big lever."""
    named = [p for p in proposals if p.named]
    by_name = {p.lever: p for p in proposals}
    insurance = [by_name.get(name) or search.Proposal(name, INSURANCE_SOURCE, None, None, named=False)
                 for name in INSURANCE if name in levers_by_name and name not in {p.lever for p in named}]
    chosen = {p.lever for p in named} | {p.lever for p in insurance}
    rest = [p for p in proposals if p.lever not in chosen]
    arranged = ordering.arrange(named + insurance + rest, best)

    def group(proposal: search.Proposal) -> int:
        if proposal.lever in INSURANCE:
            return 0 if proposal.named else 2
        if proposal.named and (proposal.expected_share_pct or 0.0) >= BIG_FINDING_SHARE_PCT:
            return 1
        return 3 if proposal.named else 4
    return sorted(arranged, key=group)  # stable: each group keeps the arranged order


def insurance_proposals(levers_by_name: dict[str, Any]) -> list[search.Proposal]:
    """The levers every workload is screened with, proposed without a diagnosis (its profile was cut)."""
    return [search.Proposal(name, CUT_PROFILE_SOURCE, None, None, named=False)
            for name in INSURANCE if name in levers_by_name]


def expected_gain_pct(proposal: search.Proposal) -> float:
    """What screening a proposal may still find: its finding's predicted gain, or UNPREDICTED_GAIN_PCT."""
    predicted = search.predicted_gain_pct(proposal.expected_share_pct)
    return UNPREDICTED_GAIN_PCT if predicted is None else predicted
