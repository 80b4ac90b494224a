"""Evaluate syntax trees produced by :mod:`exprcalc.parser`."""

from __future__ import annotations

import math
import operator
from typing import Callable, Mapping, Optional

from .errors import EvalError
from .parser import parse

FUNCTIONS: dict[str, Callable] = {
    "abs": abs,
    "min": min,
    "max": max,
    "round": round,
    "sqrt": math.sqrt,
}

_BINARY = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "//": operator.floordiv,
    "%": operator.mod,
    "^": operator.pow,
}


def evaluate_tree(node, variables: Mapping[str, float], functions: Mapping[str, Callable]):
    kind = node[0]
    if kind == "num":
        return node[1]
    if kind == "var":
        try:
            return variables[node[1]]
        except KeyError:
            raise EvalError(f"unknown variable {node[1]!r}") from None
    if kind == "neg":
        return -evaluate_tree(node[1], variables, functions)
    if kind == "bin":
        _, op, left, right = node
        a = evaluate_tree(left, variables, functions)
        b = evaluate_tree(right, variables, functions)
        try:
            return _BINARY[op](a, b)
        except ZeroDivisionError:
            raise EvalError("division by zero") from None
    if kind == "call":
        _, name, args = node
        func = functions.get(name)
        if func is None:
            raise EvalError(f"unknown function {name!r}")
        values = [evaluate_tree(arg, variables, functions) for arg in args]
        try:
            return func(*values)
        except (TypeError, ValueError) as exc:
            raise EvalError(f"{name}(): {exc}") from None
    raise EvalError(f"bad node {node!r}")  # pragma: no cover


def evaluate(
    text: str,
    variables: Optional[Mapping[str, float]] = None,
    functions: Optional[Mapping[str, Callable]] = None,
):
    """Parse and evaluate ``text``.

    ``functions`` is merged over the built-in :data:`FUNCTIONS`.
    """
    funcs = dict(FUNCTIONS)
    if functions:
        funcs.update(functions)
    return evaluate_tree(parse(text), variables or {}, funcs)
