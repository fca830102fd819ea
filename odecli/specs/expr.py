"""Safe arithmetic expressions for ODE right-hand sides.

Spec files are user input and get shared, so equation text is never given to
eval/exec/compile. It is parsed with ``ast``, checked against a small whitelist of node
types, and turned into a tree of closures that evaluate on torch tensors. Numbers stay
Python floats so that results take the dtype and device of the state tensors; an
operation between two plain numbers is done in torch (never folded in Python), so
``9**9**9`` becomes ``inf`` instead of hanging or raising.
"""

from __future__ import annotations

import ast
import difflib
import functools
import math
import operator
from typing import TYPE_CHECKING, Callable, Mapping, Union

from odecli.errors import SpecError
from odecli.ode.native.c_literal import c_double

if TYPE_CHECKING:
    from torch import Tensor

MAX_LENGTH = 10_000
MAX_DEPTH = 100

Value = Union["Tensor", float]
Env = Mapping[str, Value]
Node = Callable[[Env], Value]

# name -> (number of arguments, name of the torch function)
FUNCTIONS: dict[str, tuple[int, str]] = {
    "sin": (1, "sin"),
    "cos": (1, "cos"),
    "tan": (1, "tan"),
    "exp": (1, "exp"),
    "log": (1, "log"),
    "sqrt": (1, "sqrt"),
    "tanh": (1, "tanh"),
    "abs": (1, "abs"),
    "min": (2, "minimum"),
    "max": (2, "maximum"),
}
CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e}
# Names a spec may not use for states or parameters.
RESERVED_NAMES = frozenset(FUNCTIONS) | frozenset(CONSTANTS) | {"t"}

_BINARY: dict[type, tuple[str, Callable[[Value, Value], Value]]] = {
    ast.Add: ("+", operator.add),
    ast.Sub: ("-", operator.sub),
    ast.Mult: ("*", operator.mul),
    ast.Div: ("/", operator.truediv),
    ast.Pow: ("**", operator.pow),
}
_OTHER_OPERATORS: dict[type, str] = {
    ast.FloorDiv: "'//'",
    ast.Mod: "'%'",
    ast.MatMult: "'@'",
    ast.LShift: "'<<'",
    ast.RShift: "'>>'",
    ast.BitOr: "'|'",
    ast.BitAnd: "'&'",
    ast.BitXor: "'^' (use '**' for powers)",
    ast.Not: "'not'",
    ast.Invert: "'~'",
}
_COMPARISONS: dict[type, str] = {
    ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
    ast.Is: "is", ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in",
}
_REFUSED: dict[type, str] = {
    ast.Attribute: "'.' attribute access",
    ast.Subscript: "'[]' indexing",
    ast.Lambda: "'lambda'",
    ast.ListComp: "list comprehension",
    ast.SetComp: "set comprehension",
    ast.DictComp: "dict comprehension",
    ast.GeneratorExp: "generator expression",
    ast.JoinedStr: "f-string",
    ast.FormattedValue: "f-string",
    ast.IfExp: "'if ... else'",
    ast.NamedExpr: "':=' assignment",
    ast.Tuple: "a tuple",
    ast.List: "a list",
    ast.Dict: "a dict",
    ast.Set: "a set",
    ast.Starred: "'*' unpacking",
    ast.Slice: "slicing",
    ast.Await: "'await'",
    ast.Yield: "'yield'",
    ast.YieldFrom: "'yield'",
}


def compile_expression(text: str, names: set[str], file: str, field: str) -> Callable[[Env], Tensor]:
    """Compile ``text`` into ``f(env) -> Tensor``; ``env`` maps every name in ``names`` to a value.

    Besides ``names``, the constants ``pi`` and ``e`` and the functions in ``FUNCTIONS`` are
    allowed. Anything else raises a one-line ``SpecError(file, field, ...)`` that names the
    offending token. A constant expression evaluates to a 0-dim float64 CPU tensor; callers
    broadcast and convert the result to their batch shape, dtype and device.
    """
    tree, source = _parse(text, file, field)
    node = _Compiler(names, file, field, source).compile(tree.body)

    def evaluate(env: Env) -> Tensor:
        return _as_tensor(node(env))

    return evaluate


# name -> C spelling; the NaN-propagating helpers are defined by the code that embeds the text.
C_FUNCTIONS: dict[str, str] = {
    "sin": "sin", "cos": "cos", "tan": "tan", "exp": "exp", "log": "log", "sqrt": "sqrt",
    "tanh": "tanh", "abs": "fabs", "min": "odecli_fmin", "max": "odecli_fmax",
}


def expression_to_c(text: str, symbols: Mapping[str, str], file: str, field: str) -> str:
    """``text`` as one C ``double`` expression; ``symbols`` maps each allowed name to its C spelling.

    Validated by the same compiler as :func:`compile_expression` (same one-line errors), so the
    C text can only contain numbers, the given symbols, + - * /, ``pow`` and the whitelisted
    functions. ``x**2`` becomes ``odecli_sq(x)`` (torch squares exactly too, and ``pow`` is slow).
    """
    tree, source = _parse(text, file, field)
    _Compiler(set(symbols), file, field, source).compile(tree.body)
    return _to_c(tree.body, symbols)


def _to_c(node: ast.AST, symbols: Mapping[str, str]) -> str:
    """Print an already validated tree (depth is bounded by MAX_DEPTH, so recursion is safe)."""
    if isinstance(node, ast.Constant):
        try:
            return c_double(float(node.value))
        except OverflowError:
            return "INFINITY"
    if isinstance(node, ast.Name):
        return symbols[node.id] if node.id in symbols else c_double(CONSTANTS[node.id])
    if isinstance(node, ast.UnaryOp):
        operand = _to_c(node.operand, symbols)
        return f"(-{operand})" if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp):
        left, right = _to_c(node.left, symbols), _to_c(node.right, symbols)
        if isinstance(node.op, ast.Pow):
            exponent = node.right
            if isinstance(exponent, ast.Constant) and exponent.value == 2:
                return f"odecli_sq({left})"
            return f"pow({left}, {right})"
        symbol, _ = _BINARY[type(node.op)]
        return f"({left} {symbol} {right})"
    assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    args = ", ".join(_to_c(arg, symbols) for arg in node.args)
    return f"{C_FUNCTIONS[node.func.id]}({args})"


def _parse(text: str, file: str, field: str) -> tuple[ast.Expression, str]:
    """Parse with cheap size and depth limits first, so hostile input fails fast.

    Returns the tree and the normalised source that its node positions refer to.
    """
    if not isinstance(text, str):
        raise SpecError(file, field, f"expected an expression string, got {type(text).__name__}")
    if len(text) > MAX_LENGTH:
        raise SpecError(file, field, f"expression is {len(text)} characters long, the limit is {MAX_LENGTH}")
    # YAML block scalars may span lines; an arithmetic expression means the same on one line.
    source = " ".join(text.splitlines()).strip()
    if not source:
        raise SpecError(file, field, "empty expression")
    if _bracket_depth(source) > MAX_DEPTH:
        raise SpecError(file, field, f"expression is nested deeper than {MAX_DEPTH} levels")
    try:
        expr = ast.parse(source, mode="eval")
    except SyntaxError as exc:
        where = f" at column {exc.offset}" if exc.offset else ""
        raise SpecError(file, field, f"invalid expression{where}: {exc.msg}") from None
    except ValueError as exc:  # null bytes (a SyntaxError from Python 3.12 on)
        raise SpecError(file, field, f"invalid expression: {exc}") from None
    except (MemoryError, RecursionError):  # the parser's own limits, e.g. 5000 chained '-' or '+'
        raise SpecError(file, field, f"expression is nested deeper than {MAX_DEPTH} levels") from None
    if _tree_depth(expr) > MAX_DEPTH:
        raise SpecError(file, field, f"expression is nested deeper than {MAX_DEPTH} levels")
    return expr, source


def _bracket_depth(source: str) -> int:
    depth = deepest = 0
    for char in source:
        if char in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in ")]}":
            depth -= 1
    return deepest


def _tree_depth(tree: ast.AST) -> int:
    """Depth without recursion, so the compiler's recursion below is bounded by MAX_DEPTH."""
    deepest = 0
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            break
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest


@functools.cache
def _torch():
    """torch, imported when an expression is first evaluated: checking a spec (and failing
    fast on a bad one) does not pay the seconds ``import torch`` takes."""
    import torch

    return torch


def _is_tensor(value: object) -> bool:
    return isinstance(value, _torch().Tensor)


def _as_tensor(value: Value, like: Value | None = None) -> Tensor:
    """Make ``value`` a tensor: matching ``like`` if that is one, else 0-dim float64."""
    torch = _torch()
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(like, torch.Tensor):
        return torch.as_tensor(value, dtype=like.dtype, device=like.device)
    return torch.tensor(float(value), dtype=torch.float64)


class _Compiler:
    """Turns a whitelisted AST into closures; refuses everything else with a SpecError."""

    def __init__(self, names: set[str], file: str, field: str, source: str) -> None:
        self.names = set(names)
        self.file = file
        self.field = field
        self.source = source

    def fail(self, message: str) -> SpecError:
        return SpecError(self.file, self.field, message)

    def token(self, node: ast.AST) -> str:
        segment = ast.get_source_segment(self.source, node) or type(node).__name__
        return repr(segment if len(segment) <= 40 else segment[:37] + "...")

    def compile(self, node: ast.AST) -> Node:
        if isinstance(node, ast.Constant):
            return self.constant(node)
        if isinstance(node, ast.Name):
            return self.name(node)
        if isinstance(node, ast.BinOp):
            return self.binary(node)
        if isinstance(node, ast.UnaryOp):
            return self.unary(node)
        if isinstance(node, ast.Call):
            return self.call(node)
        if isinstance(node, ast.Compare):
            symbol = _COMPARISONS.get(type(node.ops[0]), "?")
            raise self.fail(f"comparison '{symbol}' is not allowed: {self.token(node)}")
        if isinstance(node, ast.BoolOp):
            word = "and" if isinstance(node.op, ast.And) else "or"
            raise self.fail(f"'{word}' is not allowed: {self.token(node)}")
        what = _REFUSED.get(type(node), type(node).__name__)
        raise self.fail(f"{what} is not allowed: {self.token(node)}")

    def constant(self, node: ast.Constant) -> Node:
        value = node.value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            kind = "boolean" if isinstance(value, bool) else type(value).__name__
            raise self.fail(f"{kind} literal {self.token(node)} is not allowed, only numbers")
        try:
            number = float(value)
        except OverflowError:  # an integer literal too large for a float
            number = math.inf
        return lambda env: number

    def name(self, node: ast.Name) -> Node:
        name = node.id
        if name.startswith("__"):
            raise self.fail(f"name '{name}' is not allowed: double-underscore names are reserved")
        if name in self.names:
            return lambda env: env[name]
        if name in CONSTANTS:
            number = CONSTANTS[name]
            return lambda env: number
        if name in FUNCTIONS:
            raise self.fail(f"'{name}' is a function; call it as {name}(...)")
        known = sorted(self.names | set(CONSTANTS))
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else f" (known names: {', '.join(known)})"
        raise self.fail(f"unknown name '{name}'{hint}")

    def binary(self, node: ast.BinOp) -> Node:
        if type(node.op) not in _BINARY:
            raise self.fail(f"operator {_OTHER_OPERATORS.get(type(node.op), '?')} is not allowed: {self.token(node)}")
        _, op = _BINARY[type(node.op)]
        left, right = self.compile(node.left), self.compile(node.right)

        def apply(env: Env) -> Value:
            a, b = left(env), right(env)
            if not _is_tensor(a) and not _is_tensor(b):
                a = _as_tensor(a)  # two plain numbers: torch semantics (inf/nan), never a Python hang
            return op(a, b)

        return apply

    def unary(self, node: ast.UnaryOp) -> Node:
        if not isinstance(node.op, (ast.USub, ast.UAdd)):
            raise self.fail(f"operator {_OTHER_OPERATORS.get(type(node.op), '?')} is not allowed: {self.token(node)}")
        operand = self.compile(node.operand)
        if isinstance(node.op, ast.UAdd):
            return operand
        return lambda env: -operand(env)

    def call(self, node: ast.Call) -> Node:
        func = node.func
        allowed = ", ".join(FUNCTIONS)
        if not isinstance(func, ast.Name):
            raise self.fail(f"only calls of {allowed} are allowed, got {self.token(func)}")
        name = func.id
        if name not in FUNCTIONS:
            if name in self.names or name in CONSTANTS:
                raise self.fail(f"'{name}' is not a function: {self.token(node)}")
            raise self.fail(f"unknown function '{name}' (allowed: {allowed})")
        if node.keywords:
            keyword = node.keywords[0]
            what = "'**' unpacking" if keyword.arg is None else f"keyword argument '{keyword.arg}='"
            raise self.fail(f"{what} is not allowed in {name}(): {self.token(node)}")
        arity, torch_name = FUNCTIONS[name]
        if any(isinstance(arg, ast.Starred) for arg in node.args):
            raise self.fail(f"'*' unpacking is not allowed in {name}(): {self.token(node)}")
        if len(node.args) != arity:
            plural = "argument" if arity == 1 else "arguments"
            raise self.fail(f"{name}() takes exactly {arity} {plural}, got {len(node.args)}: {self.token(node)}")
        args = [self.compile(arg) for arg in node.args]
        if arity == 1:
            (arg,) = args
            return lambda env: getattr(_torch(), torch_name)(_as_tensor(arg(env)))
        first, second = args

        def apply2(env: Env) -> Tensor:
            a, b = first(env), second(env)
            return getattr(_torch(), torch_name)(_as_tensor(a, b), _as_tensor(b, a))

        return apply2
