"""exprcalc: tokenizer, recursive-descent parser and evaluator for arithmetic."""

from .errors import CalcError, EvalError, ParseError
from .evaluate import FUNCTIONS, evaluate, evaluate_tree
from .parser import parse
from .tokens import Token, tokenize

__all__ = [
    "FUNCTIONS",
    "CalcError",
    "EvalError",
    "ParseError",
    "Token",
    "evaluate",
    "evaluate_tree",
    "parse",
    "tokenize",
]
__version__ = "0.3.0"
