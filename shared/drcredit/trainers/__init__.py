"""Glue for RL trainers: agent logs into the API's rollout format, turn advantages onto tokens.

Nothing here talks to the service: :mod:`drcredit.trainers.converters` builds the group a
trainer posts, :mod:`drcredit.trainers.tokens` spreads the advantages document it gets back
over the policy tokens of each rollout. Neither module needs torch.
"""

from __future__ import annotations

from drcredit.trainers.converters import (
    ConversionError,
    ToolNames,
    from_chat_messages,
    from_react_text,
    group_from_rollouts,
)
from drcredit.trainers.tokens import (
    broadcast_advantages,
    broadcast_advantages_torch,
    broadcast_batch,
    policy_spans,
    turn_advantages,
)

__all__ = [
    "ConversionError",
    "ToolNames",
    "broadcast_advantages",
    "broadcast_advantages_torch",
    "broadcast_batch",
    "from_chat_messages",
    "from_react_text",
    "group_from_rollouts",
    "policy_spans",
    "turn_advantages",
]
