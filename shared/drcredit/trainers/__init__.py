"""Glue for RL trainers: agent logs into the API's rollout format, turn advantages onto tokens.

The names exported here do not talk to the service: :mod:`drcredit.trainers.converters`
(chat messages, ReAct text) and :mod:`drcredit.trainers.segments` (token-level trajectories,
Search-R1 tags) build the group a trainer posts, :mod:`drcredit.trainers.tokens` spreads the
advantages document it gets back over the policy tokens of each rollout. None needs torch.
The adapters (``verl``, ``trl``, ``skyrl``, ``prime_rl``) all score through
:func:`drcredit.trainers.scoring.score_step`.
"""

from __future__ import annotations

from drcredit.trainers.converters import (
    ConversionError,
    ToolNames,
    from_chat_messages,
    from_react_text,
    group_from_rollouts,
)
from drcredit.trainers.segments import from_search_r1_text, record_from_tokens
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
    "from_search_r1_text",
    "group_from_rollouts",
    "policy_spans",
    "record_from_tokens",
    "turn_advantages",
]
