"""Spec sections declared once, as msgspec Structs: read (validated) and described (JSON Schema) from them.

A section is a :class:`Section`: its fields' names are the keys it accepts, their annotations
(``Annotated[float, Meta(gt=0)]``, ``Literal[...]``, nested sections) the values, their defaults
what a key left out means. :func:`read` checks a loaded mapping against a section and builds
it; :func:`schema` turns the same section into the JSON Schema that ``odecli schema`` prints.
Rules across fields (list lengths against the batch, stability limits, bounds around the
initial value) stay as code after this pass.

Why msgspec and not pydantic v2: the CLI's budget for ``odecli solve`` is about a second, and
msgspec costs least of it. Measured on the 2-core development machine: ``import msgspec``
39 ms cold, 5 ms warm (``python -X importtime``); ``import pydantic`` plus ``BaseModel`` 85 ms
before any model is built. ``odecli solve examples/vdp-sweep.yaml`` took 0.338 s (median of
five) with these declarations against 0.334 s before them; declaring the PDE models, unknown
and geometry too cost ``odecli validate examples/acoustic-anomaly.yaml`` 0.304 s against
0.299 s (median of eleven, alternated). msgspec converts and checks each value
(``msgspec.convert``) and writes the JSON Schema of a Struct (``msgspec.json.schema``); the
messages are worded here, in the one-line ``FILE: dotted.field: message`` form every spec
error has.

A value may be one of several sections: a union of msgspec-tagged sections is read as the one
its tag (``type``) names, a section beside other types (a model or a number) as the section
when it is a mapping, a list of sections item by item; the schema gets one branch per member.

What ``null`` (an empty key) means: a key whose value is a section, a list or a mapping reads
an empty one as its default; a scalar key does the same in sections whose ``null_is_default``
is true (the ODE solver, every PDE section) and is otherwise refused, as it is wherever its
default depends on other keys (declared with ``msgspec.UNSET``). The schema states exactly this.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from collections.abc import Hashable
from functools import lru_cache
from typing import Any, Callable, ClassVar, Literal, Union

import msgspec
from msgspec import Meta, Struct, UnsetType

from odecli.errors import SpecError
from odecli.specs.loader import describe

__all__ = ["INFINITE", "INVALID", "Meta", "Problems", "Section", "check_keys", "expected", "fields", "read", "read_value",
           "schema"]

INFINITE = {"infinite": True}  # Meta(extra=INFINITE): the float may be .inf (finite numbers otherwise)


def expected(text: str, extra: dict[str, Any] | None = None, **meta: Any) -> Meta:
    """Meta that words a value's error as ``expected <text>, got <value>``.

    ``extra`` may add ``infinite`` (see INFINITE), ``missing`` (words appended to "required
    key is missing") and ``message`` (the whole message, ``{value!r}`` standing for the value);
    ``meta``: msgspec's constraints and ``extra_json_schema``.
    """
    return Meta(extra={"expected": text, **(extra or {})}, **meta)


class Section(Struct, forbid_unknown_fields=True, frozen=True):
    """A mapping of known keys; subclasses declare them as fields."""

    null_is_default: ClassVar[bool] = True
    renamed: ClassVar[dict[str, str]] = {}  # former key -> current key, for the did-you-mean


class Problems:
    """Collects spec problems; in strict mode the first one is raised at once."""

    def __init__(self, file: str, strict: bool = True) -> None:
        self.file = file
        self.strict = strict
        self.messages: list[str] = []

    def __call__(self, field: str, message: str) -> None:
        error = SpecError(self.file, field, message)
        if self.strict:
            raise error
        self.messages.append(str(error))


_BAD = object()  # a value that was reported
INVALID = _BAD  # what read_value returns for a value it reported
_NULL = type(None)


def _join(field: str, key: Any) -> str:
    return f"{field}.{key}" if field else str(key)


# ---------------------------------------------------------------- reading


def read(value: Any, section: type[Section], field: str, report: Callable[[str, str], None]) -> Any:
    """``value`` (a loaded mapping, or null: every key left out) checked against ``section``.

    Every problem is reported (``report(field, message)``); returns the built section, or
    None where any problem was found (a strict reporter raises at the first instead).
    """
    if value is None:
        value = {}
    if not isinstance(value, dict):
        report(field, f"expected a mapping, got {describe(value)}")
        return None
    fields = _fields(section)
    ok = check_keys(value, section, field, report)
    values = {}
    for name, (annotation, required) in fields.items():
        raw = value.get(name)
        where = _join(field, name)
        if raw is None and required:
            report(where, "required key is missing" + _extra(annotation).get("missing", ""))
            ok = False
            continue
        if name not in value or (raw is None and _null_is_default(section, annotation)):
            continue
        result = read_value(raw, annotation, where, report)
        if result is _BAD:
            ok = False
        else:
            values[name] = result
    return section(**values) if ok else None


def check_keys(value: dict[Any, Any], section: type[Section], field: str, report: Callable[[str, str], None]) -> bool:
    """Report every key ``section`` does not declare, with the closest declared one; True if none."""
    unknown = [key for key in value if key not in _fields(section)]
    for key in unknown:
        report(_join(field, key), f"unknown key ({_key_hint(key, section)})")
    return not unknown


def read_value(raw: Any, annotation: Any, field: str, report: Callable[[str, str], None]) -> Any:
    """One value against its annotation; ``_BAD`` (after reporting) where it does not fit."""
    base = _base(annotation)
    if _is_section(base):
        result = read(raw, base, field, report)
        return _BAD if result is None else result
    if typing.get_origin(base) is dict:  # names of the user's choosing, each value declared
        if raw is None:
            return {}
        if not isinstance(raw, dict):
            report(field, f"expected a mapping of name: value, got {describe(raw)}")
            return _BAD
        value_type = typing.get_args(base)[1]
        out = {key: read_value(item, value_type, _join(field, key), report) for key, item in raw.items()}
        return _BAD if any(v is _BAD for v in out.values()) else out
    if _sections_in(base):
        return _read_union(raw, annotation, field, report)
    return _leaf(raw, annotation, field, report)


def _sections_in(base: Any) -> list[Any]:
    """The sections of a union (or a list of them) ``base`` names, if any."""
    found = []
    for member in _members(base):
        if typing.get_origin(member) is list:
            member = _base(typing.get_args(member)[0])
        if _is_section(member):
            found.append(member)
    return found


def _read_union(raw: Any, annotation: Any, field: str, report: Callable[[str, str], None]) -> Any:
    """A value whose declaration names sections: a mapping is read as the section its tag
    (``type``) names, or as the one section; a list as a list of them; anything else as the
    union's other members."""
    members = _members(_base(annotation))
    sections = [m for m in members if _is_section(m)]
    lists = [m for m in members if typing.get_origin(m) is list and _is_section(_base(typing.get_args(m)[0]))]
    if isinstance(raw, dict) and sections:
        section = sections[0]
        tag_field = section.__struct_config__.tag_field if len(sections) > 1 else None
        if tag_field is not None:
            tags = {s.__struct_config__.tag: s for s in sections}
            tag = raw.get(tag_field)
            where = _join(field, tag_field)
            if tag is None:
                report(where, "required key is missing")
                return _BAD
            if not isinstance(tag, Hashable) or tag not in tags:
                choices = [str(t) for t in tags]
                close = difflib.get_close_matches(tag, choices, n=1) if isinstance(tag, str) else []
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                report(where, f"expected one of {', '.join(choices)}, got {describe(tag)}{hint}")
                return _BAD
            section = tags[tag]
            raw = {key: value for key, value in raw.items() if key != tag_field}
        result = read(raw, section, field, report)
        return _BAD if result is None else result
    if isinstance(raw, list) and lists:
        element = _base(typing.get_args(lists[0])[0])
        out = [read_value(item, element, f"{field}[{index}]", report) for index, item in enumerate(raw)]
        return _BAD if any(v is _BAD for v in out) else out
    rest = [m for m in members if m not in sections and m not in lists]
    if not rest:
        extra = _extra(annotation)
        report(field, f"expected {extra.get('expected', 'a mapping')}, got {describe(raw)}")
        return _BAD
    leaf = rest[0] if len(rest) == 1 else Union[tuple(rest)]
    metas = _metas(annotation)
    return _leaf(raw, typing.Annotated[(leaf, *metas)] if metas else leaf, field, report)


def _leaf(raw: Any, annotation: Any, field: str, report: Callable[[str, str], None]) -> Any:
    """A value msgspec converts (strictly: no strings for numbers), finite unless declared INFINITE."""
    try:
        value = msgspec.convert(_whole_numbers(raw, annotation), annotation, strict=True)
    except msgspec.ValidationError as exc:
        report(*_message(raw, annotation, field, str(exc)))
        return _BAD
    if _extra(annotation).get("infinite"):
        return value
    if isinstance(value, float) and not math.isfinite(value):
        report(field, f"must be a finite number, got {describe(raw)}")
        return _BAD
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            if isinstance(item, float) and not math.isfinite(item):
                report(f"{field}[{index}]", f"must be a finite number, got {describe(raw[index])}")
                return _BAD
    return value


def _whole_numbers(raw: Any, annotation: Any) -> Any:
    """Whole floats (``1e5``) where an integer is declared, as JSON Schema's ``integer`` allows."""
    base = _base(annotation)
    if _admits(base, int) and isinstance(raw, float) and math.isfinite(raw) and raw.is_integer():
        return int(raw)
    if isinstance(raw, list) and typing.get_origin(base) in (list, tuple):
        args = [a for a in typing.get_args(base) if a is not Ellipsis]
        if args and all(_admits(_base(a), int) for a in args):
            return [int(v) if isinstance(v, float) and math.isfinite(v) and v.is_integer() else v for v in raw]
    return raw


def _message(raw: Any, annotation: Any, field: str, error: str) -> tuple[str, str]:
    """``(field, message)`` for a value msgspec refused, worded from its declaration."""
    where = re.search(r" - at `\$((?:\[\d+\])+)`$", error)
    base = _base(annotation)
    sequence = _sequence(base) if isinstance(raw, list) else None
    if where and sequence is not None:
        index = int(re.findall(r"\[(\d+)\]", where.group(1))[0])
        args = [a for a in typing.get_args(sequence) if a is not Ellipsis]
        element = args[min(index, len(args) - 1)] if typing.get_origin(sequence) is tuple else args[0]
        return _message(raw[index], element, f"{field}[{index}]", error[:where.start()])
    extra = _extra(annotation)
    got = describe(raw)
    if sequence is not None and raw == [] and "expected" in extra:
        return field, f"list is empty, expected {extra['expected']}"
    if _admits(base, float) and isinstance(raw, int) and not isinstance(raw, bool) and _too_large(raw):
        return field, f"must be a finite number, got {got}"
    if "message" in extra:  # a message worded in full, ``{value!r}`` the value given
        return field, extra["message"].format(value=raw)
    if "expected" in extra:
        return field, f"expected {extra['expected']}, got {got}"
    if typing.get_origin(base) is Literal:
        choices = [str(c) for c in typing.get_args(base)]
        close = difflib.get_close_matches(raw, choices, n=1) if isinstance(raw, str) else []
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        return field, f"expected one of {', '.join(choices)}, got {got}{hint}"
    if base is bool:
        return field, f"expected true or false, got {got}"
    if base in (int, float):
        number = not isinstance(raw, bool) and isinstance(raw, (int, float))
        if not number or (base is int and not isinstance(raw, int)):
            return field, f"expected {'a whole number' if base is int else 'a number'}, got {got}"
        bound = _bound(annotation, raw)
        return field, f"must be {bound}, got {got}" if bound else error
    if base is str:
        return field, f"expected a string, got {got}"
    return field, error[0].lower() + error[1:]


def _sequence(base: Any) -> Any:
    """The list or tuple type ``base`` is, or the first its union names (None if none)."""
    for member in [base, *_members(base)]:
        if typing.get_origin(member) in (list, tuple):
            return member
    return None


def _too_large(number: int) -> bool:
    try:
        float(number)
    except OverflowError:
        return True
    return False


def _bound(annotation: Any, value: float) -> str | None:
    """The first declared bound ``value`` breaks, as ``> 0`` or ``<= 1``."""
    for meta in _metas(annotation):
        for name, op, holds in (("gt", ">", lambda b: value > b), ("ge", ">=", lambda b: value >= b),
                                ("lt", "<", lambda b: value < b), ("le", "<=", lambda b: value <= b)):
            limit = getattr(meta, name, None)
            if limit is not None and not holds(limit):
                return f"{op} {limit:g}"
    return None


def _key_hint(key: Any, section: type[Section]) -> str:
    names = list(_fields(section))
    renamed = getattr(section, "renamed", {})
    if key in renamed:
        return f"renamed: did you mean '{renamed[key]}'?"
    close = difflib.get_close_matches(str(key), names, n=1)
    return f"did you mean '{close[0]}'?" if close else f"expected one of: {', '.join(names)}"


# ---------------------------------------------------------------- declarations, inspected


@lru_cache(maxsize=None)
def _fields(section: type[Section]) -> dict[str, tuple[Any, bool]]:
    """name -> (annotation, required), in declaration order."""
    if dataclasses.is_dataclass(section):
        hints = typing.get_type_hints(section, include_extras=True)
        return {f.name: (hints[f.name], f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
                for f in dataclasses.fields(section)}
    return {f.name: (f.type, f.required) for f in msgspec.structs.fields(section)}


def fields(section: type[Section]) -> dict[str, tuple[Any, bool]]:
    """The keys ``section`` declares: name -> (annotation, required), in declaration order."""
    return dict(_fields(section))


def _is_section(tp: Any) -> bool:
    """A Section, or a frozen dataclass declared the same way (the ODE solver's SolverSpec)."""
    return isinstance(tp, type) and (issubclass(tp, Section) or dataclasses.is_dataclass(tp))


def _strip(annotation: Any) -> Any:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _members(annotation: Any) -> list[Any]:
    annotation = _strip(annotation)
    if typing.get_origin(annotation) in (Union, types.UnionType):
        return [m for a in typing.get_args(annotation) for m in _members(a)]
    return [annotation]


def _base(annotation: Any) -> Any:
    """The annotation without Annotated, null and UNSET: the one type a value must have, if one."""
    kept = [m for m in _members(annotation) if m not in (_NULL, UnsetType)]
    if len(kept) == 1:
        return kept[0]
    return Union[tuple(kept)]  # type: ignore[return-value]


def _admits(base: Any, tp: type) -> bool:
    return any(_strip(m) is tp for m in _members(base))


def _is_leaf(tp: Any) -> bool:
    base = _base(tp)
    return not _is_section(base) and typing.get_origin(base) is not dict


def _metas(annotation: Any) -> list[Meta]:
    """Every Meta on ``annotation`` and on the members of its unions."""
    found = []
    stack = [annotation]
    while stack:
        tp = stack.pop()
        if typing.get_origin(tp) is typing.Annotated:
            found += [m for m in tp.__metadata__ if isinstance(m, Meta)]
            stack.append(typing.get_args(tp)[0])
        elif typing.get_origin(tp) in (Union, types.UnionType):
            stack += list(typing.get_args(tp))
    return found


def _extra(annotation: Any) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for meta in _metas(annotation):
        merged.update(meta.extra or {})
    return merged


def _null_is_default(section: type[Section], annotation: Any) -> bool:
    """Whether an empty (null) key reads as left out (see the module docstring)."""
    members = _members(annotation)
    if UnsetType in members:
        return _is_section(_base(annotation)) or typing.get_origin(_base(annotation)) in (dict, list)
    if _NULL in members:
        return True
    base = _base(annotation)
    return getattr(section, "null_is_default", True) or _is_section(base) or typing.get_origin(base) in (dict, list)


# ---------------------------------------------------------------- JSON Schema


def schema(section: type[Section]) -> dict[str, Any]:
    """The JSON Schema of ``section``: msgspec's, inlined (editors and tests read it by path),
    with null allowed exactly where :func:`read` takes it as left out."""
    document = msgspec.json.schema(section)
    return _describe(_inline(document, document.get("$defs", {})), section)


def _inline(node: Any, defs: dict[str, Any], within: tuple[str, ...] = ()) -> Any:
    """``node`` with every ``$ref`` replaced by its definition; a definition met again inside
    itself (a recursive union) becomes ``{}``, which :func:`_union_schema` then rewrites."""
    if isinstance(node, list):
        return [_inline(item, defs, within) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        name = node["$ref"].split("/")[-1]
        if name in within:
            return {}
        rest = {k: v for k, v in node.items() if k != "$ref"}
        return {**_inline(defs[name], defs, (*within, name)), **_inline(rest, defs, within)}
    return {k: _inline(v, defs, within) for k, v in node.items() if k not in ("$defs", "title")}


def _describe(node: dict[str, Any], section: type[Section]) -> dict[str, Any]:
    node["additionalProperties"] = False  # msgspec says so for Structs, not for dataclasses
    properties = node.get("properties", {})
    for name, (annotation, required) in _fields(section).items():
        null = not required and _null_is_default(section, annotation)
        properties[name] = _field_schema(properties[name], annotation, null)
    return node


def _field_schema(node: dict[str, Any], annotation: Any, null: bool) -> dict[str, Any]:
    node = dict(node)
    default = node.pop("default", None)
    if default is not None and not (isinstance(default, float) and not math.isfinite(default)):
        node["default"] = default  # shown by editors; JSON has no .inf, and null means "left out"
    if "anyOf" in node and {"type": "null"} in node["anyOf"]:  # msgspec's Optional: one nullable below
        rest = [n for n in node.pop("anyOf") if n != {"type": "null"}]
        node = {**(rest[0] if len(rest) == 1 else {"anyOf": rest}), **node}
    base = _base(annotation)
    if _is_section(base):
        node = _describe(node, base)
    elif typing.get_origin(base) is dict and isinstance(node.get("additionalProperties"), dict):
        value = typing.get_args(base)[1]
        node["additionalProperties"] = _field_schema(node["additionalProperties"], value,
                                                     not _is_leaf(value) or _NULL in _members(value))
    elif _members(base) != [base] and _sections_in(base):
        node = _union_schema(node, base)
    if typing.get_origin(base) is Literal:
        node["enum"] = list(typing.get_args(base))  # declaration order (msgspec sorts them)
    return nullable(node) if null else node


_DESCRIBING: set[Any] = set()  # sections whose schema is being written: how deep a recursive union goes


def _union_schema(node: dict[str, Any], base: Any) -> dict[str, Any]:
    """One branch per member of a union that names sections, each section described as
    :func:`schema` describes it. A section that contains itself (a smoothed model of a model)
    is described one level deep: its own field lists the other members only."""
    branches = []
    for member in _members(base):
        if _is_section(member):
            if member in _DESCRIBING:
                continue
            _DESCRIBING.add(member)
            try:
                branches.append(schema(member))
            finally:
                _DESCRIBING.discard(member)
        else:
            document = msgspec.json.schema(member)
            branches.append(_field_schema(_inline(document, document.get("$defs", {})), member, False))
    kept = {k: v for k, v in node.items() if k in ("description", "default")}
    return {"oneOf": branches, **kept}


def nullable(node: dict[str, Any]) -> dict[str, Any]:
    """``node`` or null."""
    if "enum" in node:
        return {**node, "enum": [*node["enum"], None] if None not in node["enum"] else node["enum"]}
    if "const" in node:
        return {**{k: v for k, v in node.items() if k != "const"}, "enum": [node["const"], None]}
    if "type" in node:
        kinds = node["type"] if isinstance(node["type"], list) else [node["type"]]
        return {**node, "type": kinds if "null" in kinds else [*kinds, "null"]}
    for key in ("anyOf", "oneOf"):
        if key in node:
            return {**node, key: [{"type": "null"}, *node[key]]}
    raise ValueError(f"cannot make {node} nullable")
