"""LLM judges: the interface, the prompts and the backends (``openai``, ``offline``)."""

from drcredit.judges.base import (
    Attempt,
    Judge,
    JudgeResult,
    SnippetJudgeRequest,
    VisitJudgeRequest,
)
from drcredit.judges.factory import build_judge

__all__ = [
    "Attempt",
    "Judge",
    "JudgeResult",
    "SnippetJudgeRequest",
    "VisitJudgeRequest",
    "build_judge",
]
