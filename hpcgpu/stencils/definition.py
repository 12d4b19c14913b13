"""Read a stencil function once: its Python source becomes a small expression tree.

A stencil function computes the new values of one cell from its neighbours::

    def gray_scott(u, v, feed, kill, diffusion_u, diffusion_v, dt):
        laplacian_u = u[-1, 0] + u[1, 0] + u[0, -1] + u[0, 1] - 4 * u[0, 0]
        laplacian_v = v[-1, 0] + v[1, 0] + v[0, -1] + v[0, 1] - 4 * v[0, 0]
        reaction = u[0, 0] * v[0, 0] * v[0, 0]
        return (u[0, 0] + dt * (diffusion_u * laplacian_u - reaction + feed * (1 - u[0, 0])),
                v[0, 0] + dt * (diffusion_v * laplacian_v + reaction - (feed + kill) * v[0, 0]))

- A parameter indexed with integer constants is an *input field*; the indices are offsets from the
  cell being updated, one per axis, C order (in 2D ``u[0, 1]`` is the next cell along x, ``u[-1, 0]``
  the previous one along y).
- A parameter used without an index is a *scalar parameter* (a number given at each call).
- The function returns one value per *output field* (one value, or a tuple of values).

The body may assign local names (``name = expr``, ``name += expr``) and use ``+ - * /``, ``x ** n``
(``n`` an integer constant 0..8, evaluated as repeated multiplication), unary minus, ``abs``, ``min``,
``max``, ``a if condition else b`` (conditions: comparisons with ``and`` / ``or`` / ``not``) and the
functions of :data:`FUNCTIONS` as ``math.NAME`` or ``np.NAME``. Anything else (loops, ``if``
statements, calls to other functions, non-constant indices, attribute access) is refused with a
:class:`StencilDefinitionError` naming the line.

:func:`parse` turns the function into a :class:`StencilDefinition`: the statements as a tree of the
node classes below, which :mod:`hpcgpu.stencils.codegen_cpu` and :mod:`hpcgpu.stencils.codegen_cuda`
print as Numba and CUDA C source. Both print the *same* tree, operation by operation in the order
Python evaluates it, so the CPU and GPU kernels perform the same floating-point operations.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass

from hpcgpu.errors import ConfigurationError
from hpcgpu.locations import shown_path

#: Functions a stencil may call as ``math.NAME`` or ``np.NAME`` (one argument each).
FUNCTIONS = ("sqrt", "exp", "log", "sin", "cos", "tan", "tanh", "floor", "ceil")

#: The largest integer exponent of ``x ** n``.
MAX_POWER = 8

_MODULE_PREFIXES = ("math", "np", "numpy")
_BINARY = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
_COMPARE = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}


class StencilDefinitionError(ConfigurationError):
    """A stencil function uses a construct the kernel layer cannot compile, or is inconsistent."""


# ---------------------------------------------------------------------- the expression tree
@dataclass(frozen=True)
class Constant:
    """A number written in the function (converted to the fields' dtype)."""
    value: float


@dataclass(frozen=True)
class Parameter:
    """A scalar parameter of the function."""
    name: str


@dataclass(frozen=True)
class Local:
    """A local name assigned in the body."""
    name: str


@dataclass(frozen=True)
class Access:
    """``field[offsets]``: the input field at a constant offset from the updated cell."""
    field: str
    offsets: tuple


@dataclass(frozen=True)
class Negate:
    operand: object


@dataclass(frozen=True)
class Binary:
    """``left op right`` with op one of ``+ - * /``."""
    op: str
    left: object
    right: object


@dataclass(frozen=True)
class Call:
    """``function(argument)`` with function ``abs`` or one of :data:`FUNCTIONS`."""
    function: str
    argument: object


@dataclass(frozen=True)
class Select:
    """``if_true if condition else if_false``."""
    condition: object
    if_true: object
    if_false: object


@dataclass(frozen=True)
class Compare:
    """``left op right`` with op one of ``< <= > >= == !=`` (a condition, not a number)."""
    op: str
    left: object
    right: object


@dataclass(frozen=True)
class Logic:
    """``left and right`` / ``left or right`` of two conditions."""
    op: str
    left: object
    right: object


@dataclass(frozen=True)
class Not:
    operand: object


@dataclass(frozen=True)
class Assign:
    """One statement: ``name = value``."""
    name: str
    value: object


@dataclass(frozen=True)
class StencilDefinition:
    """What :func:`parse` read from a stencil function.

    Attributes
    ----------
    name : str
        The function's name.
    fields : tuple of str
        The input fields, in the order of the function's parameters.
    parameters : tuple of str
        The scalar parameters, in the order of the function's parameters.
    statements : tuple of Assign
        The body before the return, in order.
    outputs : tuple
        One expression per output field.
    ndim : int
        Axes of the fields (the number of indices of every access).
    accesses : dict of str to tuple of tuple of int
        Every offset read from each field, sorted.
    site : str
        ``"file.py:LINE"`` of the ``def`` line (named in errors about the stencil).
    """

    name: str
    fields: tuple
    parameters: tuple
    statements: tuple
    outputs: tuple
    ndim: int
    accesses: dict
    site: str = ""

    @property
    def n_outputs(self) -> int:
        return len(self.outputs)


# ---------------------------------------------------------------------- parsing
def parse(function) -> StencilDefinition:
    """Read ``function``'s source into a :class:`StencilDefinition`.

    Raises
    ------
    StencilDefinitionError
        The function uses an unsupported construct, indexes fields inconsistently, or returns nothing.
    """
    try:
        source = textwrap.dedent(inspect.getsource(function))
        first_line = inspect.getsourcelines(function)[1]
        path = shown_path(inspect.getsourcefile(function) or "<unknown>")
    except (OSError, TypeError) as error:
        raise StencilDefinitionError(
            f"cannot read the source of {function!r} ({error}); expected a function defined in a file "
            "(a stencil is compiled from its source). Define it with `def` in a module or script.") from None
    tree = ast.parse(source)
    definitions = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    if not definitions:
        raise StencilDefinitionError(f"{function!r} is not a `def` function; expected `def name(fields..., parameters...)`")
    return _Reader(definitions[0], source.splitlines(), first_line - 1, getattr(function, "__name__", "stencil"),
                   path).read()


class _Reader:
    def __init__(self, node: ast.FunctionDef, lines, line_offset: int, name: str, path: str = "<unknown>"):
        self.node, self.lines, self.line_offset, self.name, self.path = node, lines, line_offset, name, path
        self.locals: set[str] = set()
        self.accesses: dict[str, set] = {}
        self.ndim = None

    # -------------------------------------------------------------- errors
    def error(self, node, what: str, fix: str) -> StencilDefinitionError:
        line = getattr(node, "lineno", self.node.lineno)
        text = self.lines[line - 1].strip() if 0 < line <= len(self.lines) else ""
        return StencilDefinitionError(
            f"{self.path}, line {line + self.line_offset}, stencil {self.name!r}: {what} (in `{text}`). {fix}")

    # -------------------------------------------------------------- the function
    def read(self) -> StencilDefinition:
        arguments = self.node.args
        if arguments.vararg or arguments.kwarg or arguments.kwonlyargs or arguments.defaults or arguments.posonlyargs:
            raise self.error(self.node, "the signature has defaults, *args, **kwargs or keyword-only parameters",
                             "Expected plain parameters: fields first or last, scalar parameters, no defaults.")
        if self.node.decorator_list and len(self.node.decorator_list) > 1:
            raise self.error(self.node, "more than one decorator", "Decorate a stencil with hpcgpu.stencil only.")
        names = [a.arg for a in arguments.args]
        indexed = {n.value.id for n in ast.walk(self.node)
                   if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name)}
        self.field_names = [n for n in names if n in indexed]
        self.parameter_names = [n for n in names if n not in indexed]
        if not self.field_names:
            raise self.error(self.node, "no parameter is indexed as a field",
                             "Read input fields with relative indices, e.g. u[0, 0] for the cell itself, u[-1, 0].")
        body = list(self.node.body)
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            body = body[1:]   # the docstring
        if not body or not isinstance(body[-1], ast.Return) or body[-1].value is None:
            raise self.error(body[-1] if body else self.node, "the function does not end with `return VALUE`",
                             "Return the new value of the cell (or a tuple, one value per output field).")
        statements = []
        for statement in body[:-1]:
            statements.append(self.statement(statement))
        returned = body[-1].value
        values = returned.elts if isinstance(returned, ast.Tuple) else [returned]
        outputs = tuple(self.number(value) for value in values)
        accesses = {name: tuple(sorted(self.accesses.get(name, ()))) for name in self.field_names}
        return StencilDefinition(self.name, tuple(self.field_names), tuple(self.parameter_names), tuple(statements),
                                 outputs, self.ndim, accesses, f"{self.path}:{self.node.lineno + self.line_offset}")

    def statement(self, node) -> Assign:
        if isinstance(node, ast.Assign):
            if len(node.targets) != 1 or not isinstance(node.targets[0], ast.Name):
                raise self.error(node, "an assignment to something other than one local name",
                                 "Assign one local name per statement (`a = ...`); fields are written by returning values.")
            target, value = node.targets[0].id, self.number(node.value)
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) and type(node.op) in _BINARY:
            target = node.target.id
            if target not in self.locals:
                raise self.error(node, f"`{target}` is updated before it is assigned", "Assign it first.")
            value = Binary(_BINARY[type(node.op)], Local(target), self.number(node.value))
        elif isinstance(node, ast.Return):
            raise self.error(node, "a `return` before the end", "Return once, as the last statement.")
        else:
            raise self.error(node, f"unsupported statement ({type(node).__name__})",
                             "A stencil body holds assignments to local names and one final return; "
                             "use `a if condition else b` instead of `if` statements.")
        if target in self.field_names or target in self.parameter_names:
            raise self.error(node, f"assignment to the parameter `{target}`", "Use a new local name.")
        self.locals.add(target)
        return Assign(target, value)

    # -------------------------------------------------------------- expressions
    def number(self, node):
        """An expression with a numeric value."""
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
                raise self.error(node, f"the constant {node.value!r} is not a number", "Use int or float constants.")
            return Constant(float(node.value))
        if isinstance(node, ast.Name):
            if node.id in self.field_names:
                raise self.error(node, f"the field `{node.id}` is used without an index",
                                 f"Read the cell itself as {node.id}[{', '.join(['0'] * (self.ndim or 2))}].")
            if node.id in self.parameter_names:
                return Parameter(node.id)
            if node.id in self.locals:
                return Local(node.id)
            raise self.error(node, f"`{node.id}` is neither a parameter nor an assigned local name",
                             "Pass it as a scalar parameter of the stencil, or assign it before use.")
        if isinstance(node, ast.Subscript):
            return self.access(node)
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.USub):
                return Negate(self.number(node.operand))
            if isinstance(node.op, ast.UAdd):
                return self.number(node.operand)
            raise self.error(node, "`not` or `~` where a number is expected", "Use `not` only inside conditions.")
        if isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.Pow):
                return self.power(node)
            if type(node.op) not in _BINARY:
                raise self.error(node, f"the operator {type(node.op).__name__} is not supported",
                                 "Use + - * / and ** with an integer constant exponent.")
            return Binary(_BINARY[type(node.op)], self.number(node.left), self.number(node.right))
        if isinstance(node, ast.IfExp):
            return Select(self.condition(node.test), self.number(node.body), self.number(node.orelse))
        if isinstance(node, ast.Call):
            return self.call(node)
        if isinstance(node, (ast.Compare, ast.BoolOp)):
            raise self.error(node, "a condition where a number is expected",
                             "Use conditions only in `a if condition else b`.")
        raise self.error(node, f"unsupported expression ({type(node).__name__})",
                         "Expected numbers, parameters, locals, field[offsets], arithmetic, calls of abs/min/max/math "
                         "functions and `a if condition else b`.")

    def condition(self, node):
        if isinstance(node, ast.Compare):
            if len(node.ops) != 1 or type(node.ops[0]) not in _COMPARE:
                raise self.error(node, "a chained or unsupported comparison",
                                 "Compare two numbers with < <= > >= == != (join several with `and`).")
            return Compare(_COMPARE[type(node.ops[0])], self.number(node.left), self.number(node.comparators[0]))
        if isinstance(node, ast.BoolOp):
            op = "and" if isinstance(node.op, ast.And) else "or"
            values = [self.condition(v) for v in node.values]
            result = values[0]
            for value in values[1:]:
                result = Logic(op, result, value)
            return result
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return Not(self.condition(node.operand))
        raise self.error(node, "a number where a condition is expected", "Write a comparison, e.g. `u[0, 0] > 0`.")

    def access(self, node: ast.Subscript) -> Access:
        if not isinstance(node.value, ast.Name) or node.value.id not in self.field_names:
            raise self.error(node, "indexing of something other than an input field",
                             "Index only the stencil's field parameters.")
        index = node.slice
        items = index.elts if isinstance(index, ast.Tuple) else [index]
        offsets = []
        for item in items:
            value = _integer_constant(item)
            if value is None:
                raise self.error(node, f"the index {ast.unparse(item)!r} is not an integer constant",
                                 "Index fields with constant relative offsets such as u[0, 1] or u[-1, 0].")
            offsets.append(value)
        if self.ndim is None:
            self.ndim = len(offsets)
            if not 1 <= self.ndim <= 3:
                raise self.error(node, f"{self.ndim} indices", "Fields have 1 to 3 axes: one offset per axis.")
        elif len(offsets) != self.ndim:
            raise self.error(node, f"{len(offsets)} indices where earlier accesses have {self.ndim}",
                             "Index every field with one offset per axis of the grid.")
        self.accesses.setdefault(node.value.id, set()).add(tuple(offsets))
        return Access(node.value.id, tuple(offsets))

    def power(self, node: ast.BinOp):
        exponent = _integer_constant(node.right)
        if exponent is None or not 0 <= exponent <= MAX_POWER:
            raise self.error(node, f"the exponent {ast.unparse(node.right)!r} is not an integer constant 0..{MAX_POWER}",
                             "Use x ** n with a small integer n, or math.exp / math.sqrt.")
        base = self.number(node.left)
        if exponent == 0:
            return Constant(1.0)
        result = base
        for _ in range(exponent - 1):
            result = Binary("*", result, base)
        return result

    def call(self, node: ast.Call):
        if node.keywords:
            raise self.error(node, "a call with keyword arguments", "Pass arguments by position.")
        function = node.func
        if isinstance(function, ast.Name) and function.id in ("min", "max"):
            if len(node.args) < 2:
                raise self.error(node, f"{function.id} of fewer than two values", "Give two or more numbers.")
            values = [self.number(a) for a in node.args]
            result = values[0]
            for value in values[1:]:
                # Python's min(a, b) is a unless b < a (max: unless b > a); NaN handling follows.
                result = Select(Compare("<" if function.id == "min" else ">", value, result), value, result)
            return result
        if isinstance(function, ast.Name) and function.id == "abs":
            name = "abs"
        elif isinstance(function, ast.Attribute) and isinstance(function.value, ast.Name) \
                and function.value.id in _MODULE_PREFIXES and function.attr in FUNCTIONS:
            name = function.attr
        else:
            raise self.error(node, f"a call of {ast.unparse(function)!r}",
                             f"Stencils may call abs, min, max and math.NAME / np.NAME for NAME in {', '.join(FUNCTIONS)}.")
        if len(node.args) != 1:
            raise self.error(node, f"{name} with {len(node.args)} arguments", "It takes one.")
        return Call(name, self.number(node.args[0]))


def _integer_constant(node) -> int | None:
    """The value of an integer constant (``3``, ``-1``), None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _integer_constant(node.operand)
        if inner is not None:
            return -inner if isinstance(node.op, ast.USub) else inner
    return None
