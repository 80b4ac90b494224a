"""Test doubles that speak the real protocols: a scripted OpenAI-compatible model server (the
teacher) and the policies that choose what it says. The suite and the demos use them where a
real model would cost a GPU.

The server loads transformers on first use, so importing a policy stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

from orchard.testing.policies import (
    FunctionPolicy,
    Policy,
    PolicyError,
    Reply,
    ScriptedPolicy,
    ScriptExhausted,
    ToolCall,
)

_LAZY = {name: "orchard.testing.teacher" for name in ("TeacherServer", "create_teacher_app")}

__all__ = ["FunctionPolicy", "Policy", "PolicyError", "Reply", "ScriptExhausted",
           "ScriptedPolicy", "ToolCall", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
