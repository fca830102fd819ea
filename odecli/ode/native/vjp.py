"""C source for the vector-Jacobian product ``v^T df/dy``, ``v^T df/dp`` of a native right-hand side.

Why: the native ODE gradient's reverse sweep needs, at every stage, the adjoint state times
the Jacobians of ``f(t, y, p)``. A :class:`~odecli.ode.native.NativeRhs` holds ``f`` only as
C expression text (as :func:`odecli.specs.expr.expression_to_c` prints it), so the text is
parsed back (it is valid Python expression syntax) and differentiated here in reverse mode:
any right-hand side the C solver runs can then be differentiated without its spec.

The derivative rules are PyTorch autograd's, written in its order of operations (ties of
min/max share the gradient, ``abs`` has derivative 0 at 0 and at NaN, ``pow`` guards zero
exponents and zero bases), so the generated code agrees with the torch reference to round-off
(not bit for bit: torch's vectorised tanh, pow and tanh's backward round differently from libm).
Anything outside the grammar raises ``ValueError``; callers fall back to torch.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Sequence

_ARITY = {"sin": 1, "cos": 1, "tan": 1, "exp": 1, "log": 1, "sqrt": 1, "tanh": 1, "fabs": 1,
          "odecli_sq": 1, "odecli_fmin": 2, "odecli_fmax": 2, "pow": 2}
_OPERATORS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
_CONSTANTS = ("INFINITY", "NAN")

_PROLOGUE = """\
/* torch.sign: 0 at 0 and at NaN, so |a|' is 0 there, as in autograd. */
static inline double vjp_sign(double a) { return (double)((a > 0.0) - (a < 0.0)); }

/* ybar += v^T df/dy, pbar += v^T df/dp at (t, y, p), one sample */
static inline void rhs_vjp(double t, const double *restrict y, const double *restrict p,
                           const double *restrict v, double *restrict ybar, double *restrict pbar)
{
"""


@dataclass(frozen=True)
class _Value:
    """One node of an equation after the forward sweep."""

    c: str  # a leaf's C text, or the temporary that holds the node's value
    op: str = ""  # "" for a leaf, else an operator (+ - * / neg) or a function name
    args: tuple[_Value, ...] = ()
    bar: str = ""  # for a leaf y[k] or p[j]: where its adjoint accumulates (ybar[k], pbar[j])
    active: bool = False  # depends on some y[k] or p[j]


def rhs_vjp_source(equations: Sequence[str]) -> str:
    """C function ``rhs_vjp`` (plus its ``vjp_`` helpers) for ``dy[i]/dt = equations[i]``.

    ``rhs_vjp(t, y, p, v, ybar, pbar)`` adds ``v^T df/dy`` to ``ybar`` and ``v^T df/dp`` to
    ``pbar`` for one sample; it expects ``odecli_sq``, ``odecli_fmin``, ``odecli_fmax`` and
    ``math.h`` from the surrounding file. Raises ``ValueError`` for text outside the grammar.
    """
    writer = _Writer(len(equations))
    roots = [writer.parse(text, i) for i, text in enumerate(equations)]
    for i, root in enumerate(roots):
        writer.reverse(root, f"v[{i}]")
    body = "".join(f"    {line}\n" for line in writer.forward_lines + writer.reverse_lines)
    return _PROLOGUE + body + "}\n"


_PULLBACK = """
/* The sweep's interface to rhs_vjp (expressions read no shared weights, keep nothing and defer nothing). */
static inline void rhs_pullback(double t, const double *restrict y, const double *restrict p,
                                const double *restrict w, const double *restrict keep, const double *restrict v,
                                double *restrict ybar, double *restrict pbar, double *restrict wbar)
{
    (void)w; (void)keep; (void)wbar;
    rhs_vjp(t, y, p, v, ybar, pbar);
}

static void rhs_pullback_flush(double *restrict wbar) { (void)wbar; }
"""


def equations_pullback_c(equations: Sequence[str]) -> str:
    """:func:`rhs_vjp_source` plus the ``rhs_pullback`` the gradient sweep calls (see reverse)."""
    return rhs_vjp_source(equations) + _PULLBACK


class _Writer:
    """Emits the forward sweep (one temporary per operation) and the reverse sweep."""

    def __init__(self, n_states: int) -> None:
        self.n_states = n_states
        self.forward_lines: list[str] = []
        self.reverse_lines: list[str] = []
        self.count = 0

    def parse(self, text: str, index: int) -> _Value:
        try:
            return self.forward(ast.parse(text, mode="eval").body)
        except (SyntaxError, RecursionError, MemoryError) as exc:
            raise ValueError(f"equation {index}: cannot parse {text!r}: {exc}") from None
        except ValueError as exc:
            raise ValueError(f"equation {index}: {exc}") from None

    def fresh(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def forward(self, node: ast.expr) -> _Value:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return _Value(repr(node.value))
        if isinstance(node, ast.Name) and node.id in ("t", *_CONSTANTS):
            return _Value(node.id)
        if isinstance(node, ast.Subscript):
            return self.leaf(node)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            (operand,) = args = (self.forward(node.operand),)
            return self.operation("neg", args, f"(-{operand.c})")
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            symbol = _OPERATORS[type(node.op)]
            left, right = args = (self.forward(node.left), self.forward(node.right))
            return self.operation(symbol, args, f"({left.c} {symbol} {right.c})")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _ARITY:
            name = node.func.id
            if node.keywords or len(node.args) != _ARITY[name]:
                raise ValueError(f"{name}() takes {_ARITY[name]} plain argument(s): {ast.unparse(node)!r}")
            args = tuple(self.forward(arg) for arg in node.args)
            return self.operation(name, args, f"{name}({', '.join(arg.c for arg in args)})")
        raise ValueError(f"unsupported C syntax {ast.unparse(node)!r}")

    def leaf(self, node: ast.Subscript) -> _Value:
        """``y[k]`` (0 <= k < number of equations) or ``p[j]`` with integer literals."""
        index = node.slice
        if (isinstance(node.value, ast.Name) and node.value.id in ("y", "p") and isinstance(index, ast.Constant)
                and type(index.value) is int and (index.value < self.n_states or node.value.id == "p")):
            array = node.value.id
            return _Value(f"{array}[{index.value}]", bar=f"{array}bar[{index.value}]", active=True)
        raise ValueError(f"unsupported subscript {ast.unparse(node)!r} (only y[0..{self.n_states - 1}] and p[j])")

    def operation(self, op: str, args: tuple[_Value, ...], expression: str) -> _Value:
        name = self.fresh("f")
        self.forward_lines.append(f"const double {name} = {expression};")
        return _Value(name, op, args, active=any(arg.active for arg in args))

    def reverse(self, value: _Value, g: str) -> None:
        """Send adjoint ``g`` (C text) of ``value`` down to its leaves, skipping constant subtrees."""
        if not value.active:
            return
        if not value.op:
            self.reverse_lines.append(f"{value.bar} += {g};")
            return
        for arg, adjoint in zip(value.args, _local_adjoints(value, g)):
            if not arg.active:
                continue
            if arg.op and adjoint != g:
                name = self.fresh("g")
                self.reverse_lines.append(f"const double {name} = {adjoint};")
                adjoint = name
            self.reverse(arg, adjoint)


def _local_adjoints(value: _Value, g: str) -> tuple[str, ...]:
    """Adjoints of ``value``'s arguments given its adjoint ``g``: torch autograd's formulas."""
    z, op = value.c, value.op
    a = value.args[0].c
    if len(value.args) == 1:
        return ({
            "neg": f"(-{g})",
            "sin": f"({g} * cos({a}))",
            "cos": f"({g} * (-sin({a})))",
            "tan": f"({g} * (1.0 + {z} * {z}))",
            "exp": f"({g} * {z})",
            "log": f"({g} / {a})",
            "sqrt": f"({g} / (2.0 * {z}))",
            "tanh": f"({g} * (1.0 - {z} * {z}))",
            "fabs": f"({g} * vjp_sign({a}))",
            "odecli_sq": f"({g} * (2.0 * {a}))",
        }[op],)
    b = value.args[1].c
    half = f"{g} / 2.0"
    return {
        "+": (g, g),
        "-": (g, f"(-{g})"),
        "*": (f"({g} * {b})", f"({g} * {a})"),
        "/": (f"({g} / {b})", f"((-{g}) * ({z} / {b}))"),  # -g * ((a / b) / b), and z is a / b
        "odecli_fmin": (f"({a} > {b} ? 0.0 : {a} == {b} ? {half} : {g})",
                        f"({a} < {b} ? 0.0 : {a} == {b} ? {half} : {g})"),
        "odecli_fmax": (f"({a} < {b} ? 0.0 : {a} == {b} ? {half} : {g})",
                        f"({a} > {b} ? 0.0 : {a} == {b} ? {half} : {g})"),
        "pow": (f"({b} == 0.0 ? 0.0 : {g} * ({b} * pow({a}, {b} - 1.0)))",
                f"(({a} == 0.0 && {b} >= 0.0) ? 0.0 : {g} * ({z} * log({a})))"),
    }[op]
