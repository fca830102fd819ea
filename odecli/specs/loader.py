"""Reading spec files: YAML text in, a plain dict out, every failure a one-line error.

The loader is PyYAML's safe loader (no object construction; LibYAML's parser when present)
with three changes that remove common surprises in hand-written specs:
- ``1e-6`` is a float (YAML 1.1 would read it as the string "1e-6");
- only true/false are booleans, so a state or key named ``on``, ``no`` or ``yes`` stays a string;
- a key given twice in one mapping is an error instead of silently keeping the last one.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from odecli.errors import InputError, SpecError

_BOOL_TAG = "tag:yaml.org,2002:bool"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_MERGE_TAG = "tag:yaml.org,2002:merge"
MAX_DEPTH = 64  # nesting levels a spec may have; no section needs more than a handful


def spec_loader(base: type = yaml.SafeLoader) -> type:
    """The spec loader on top of ``base``, a safe loader (pure Python, or LibYAML's parser)."""

    class SpecLoader(base):
        """SafeLoader with YAML 1.2 style booleans, exponent floats and duplicate-key errors."""

        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != _MERGE_TAG:
                    key = self.construct_object(key_node)
                    if key in seen:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"duplicate key {key!r}", key_node.start_mark
                        )
                    seen.add(key)
            return super().construct_mapping(node, deep=deep)

    SpecLoader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != _BOOL_TAG]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    SpecLoader.add_implicit_resolver(
        _BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
    )
    SpecLoader.add_implicit_resolver(
        _FLOAT_TAG,
        re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
        list("-+0123456789."),
    )
    return SpecLoader


# LibYAML's parser, where PyYAML was built with it, reads the same values about 10x faster (specs
# may list thousands of per-sample values); the pure-Python one words errors better (it names
# the offending character or alias), so it re-reads a file that fails.
_FAST_LOADER = spec_loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader))
_LOADER = spec_loader()


def load_yaml(path: str | Path) -> tuple[dict[str, Any], str]:
    """Read a spec file; return its top-level mapping and its text (kept for provenance)."""
    file = str(path)
    path = Path(path)
    if not path.exists():
        raise SpecError(file, "", "file not found")
    if path.is_dir():
        raise SpecError(file, "", "is a folder, expected a YAML file")
    check_regular(path, file)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise SpecError(file, "", "not a UTF-8 text file") from None
    except OSError as exc:
        raise InputError(f"{file}: cannot read: {exc.strerror or exc}") from None
    return parse_yaml(text, file), text


def parse_yaml(text: str, file: str) -> dict[str, Any]:
    """Parse spec text (``file`` only names it in errors); the top level must be a mapping."""
    try:
        try:
            data = yaml.load(text, Loader=_FAST_LOADER)  # noqa: S506 - a spec_loader() is a SafeLoader
        except yaml.YAMLError:
            data = _parse_for_errors(text, file)
    except RecursionError:
        raise SpecError(file, "", f"nested too deeply to read (a spec needs at most {MAX_DEPTH} levels)") from None
    except (ValueError, OverflowError, TypeError) as exc:  # an explicit tag on a value it cannot hold
        raise SpecError(file, "", f"invalid YAML: a tagged value cannot be read ({exc})") from None
    _check_tree(data, file)
    if data is None:
        raise SpecError(file, "", "file is empty, expected a mapping with a 'kind' key")
    if not isinstance(data, dict):
        raise SpecError(file, "", f"top level must be a mapping of keys, got {describe(data)}")
    return data


def check_regular(path: Path, file: str, what: str = "file") -> None:
    """Refuse a path that is not a regular file (a FIFO or a device would block or never end)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise InputError(f"{file}: cannot read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise SpecError(file, "", f"not a regular {what} (a pipe, a device or a socket cannot be read as one)")


def _check_tree(data: Any, file: str) -> None:
    """Refuse nesting deeper than :data:`MAX_DEPTH` and integers no float can hold (every number
    of a spec is used as a float somewhere; ``int(1e400)`` would end in OverflowError later).
    Iterative, so no recursion limit is met on the way."""
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        value, where, level = stack.pop()
        if isinstance(value, (dict, list)):
            if level >= MAX_DEPTH:
                raise SpecError(file, where, f"nested more than {MAX_DEPTH} levels deep; a spec needs a handful")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, child in items:
                if isinstance(key, str):
                    _check_text(key, file, where)
                path = f"{where}[{key}]" if isinstance(value, list) else (f"{where}.{key}" if where else str(key))
                stack.append((child, path, level + 1))
        elif isinstance(value, str):
            _check_text(value, file, where)
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > _LARGEST:
            raise SpecError(file, where, f"integer of {len(str(abs(value)))} digits is too large (at most about 1.8e308)")


_LARGEST = int(1.7976931348623157e308)


def _check_text(text: str, file: str, where: str) -> None:
    """Refuse a string YAML's ``"\\udcff"`` escape made of an unpaired surrogate: it is no
    character, and printing or writing it (an error message, the run file) failed with
    UnicodeEncodeError, an internal error (issue 42)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise SpecError(file, where, f"text holds an unpaired surrogate \\u{ord(text[exc.start]):04x}, which is not "
                        "a character (a \\uD800-\\uDFFF escape)") from None


def _parse_for_errors(text: str, file: str) -> Any:
    """Parse with the pure-Python loader, turning its error into a one-line SpecError."""
    try:
        return yaml.load(text, Loader=_LOADER)  # noqa: S506 - a spec_loader() is a SafeLoader
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = " ".join(str(exc.problem or exc.context or "syntax error").split())
        raise SpecError(file, "", f"invalid YAML{where}: {problem}") from None
    except yaml.YAMLError as exc:
        raise SpecError(file, "", f"invalid YAML: {' '.join(str(exc).split())}") from None


def spec_kind(data: dict[str, Any], file: str) -> str:
    """The required ``kind`` of a spec, which selects its validator (``ode``, ...)."""
    if "kind" not in data:
        raise SpecError(file, "kind", "required key is missing (e.g. 'kind: ode')")
    kind = data["kind"]
    if not isinstance(kind, str) or not kind:
        raise SpecError(file, "kind", f"expected a string such as 'ode', got {describe(kind)}")
    return kind


def describe(value: Any) -> str:
    """A short, one-line rendering of a YAML value for 'got ...' in error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return "string " + repr(shown)
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__
