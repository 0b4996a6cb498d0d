"""One argument and error contract for every way an agent calls a tool: MCP (stdio, HTTP) and LlamaIndex.

The tool methods' `Annotated[..., Field(...)]` parameters are the only declaration. MCP publishes them as the input
schema and LlamaIndex as the function schema; `check_arguments` enforces them with the project's own messages before
a tool runs, so a bad call gets the same `{"error", "tool", "hint"}` reply on every path (the MCP SDK's pydantic
validation is bypassed on purpose: its text differs, it ignores unknown arguments and it takes `true` for 1).
"""

import functools
import inspect
import json
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic.fields import FieldInfo

__all__ = ["Param", "ToolCallError", "check_arguments", "params", "refusal", "usage"]


class ToolCallError(ValueError):
    """A call the agent can fix: the message says what is wrong, `hint` how to call instead (never a traceback)."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


@dataclass(frozen=True)
class Param:
    """One tool argument as declared: its JSON type, bounds and default."""

    name: str
    kind: type  # str, int, bool or list (of strings)
    required: bool
    default: Any = None
    nullable: bool = False  # the schema admits null (the annotation says `| None`): null then means absent
    ge: int | None = None
    le: int | None = None
    min_length: int | None = None
    max_length: int | None = None
    item_max_length: int | None = None  # each string of a list
    choices: tuple[str, ...] = ()

    def expects(self) -> str:
        """What a valid value is, in words an agent can act on."""
        if self.choices:
            return " or ".join(repr(c) for c in self.choices)
        if self.kind is bool:
            return "true or false"
        if self.kind is int:
            return f"an integer from {self.ge} to {self.le}" if self.ge is not None else "an integer"
        if self.kind is list:
            most = f"at most {self.max_length} " if self.max_length else ""
            each = f" (each at most {self.item_max_length} characters)" if self.item_max_length else ""
            return f"a list of {most}strings{each}"
        if self.min_length and self.max_length:
            return f"a string of {self.min_length} to {self.max_length} characters"
        return f"a string of at most {self.max_length} characters" if self.max_length else "a string"


def params(method: Callable[..., Any]) -> tuple[Param, ...]:
    """The declared arguments of a tool method (bound or not), read from its annotations."""
    return _params(getattr(method, "__func__", method))


@functools.cache
def _params(function: Callable[..., Any]) -> tuple[Param, ...]:
    hints = typing.get_type_hints(function, include_extras=True)
    found = []
    for parameter in inspect.signature(function).parameters.values():
        if parameter.name == "self":
            continue
        found.append(_param(parameter, hints[parameter.name]))
    return tuple(found)


def _param(parameter: inspect.Parameter, hint: Any) -> Param:
    base, constraints, nullable = _unwrap(hint)
    required = parameter.default is inspect.Parameter.empty
    fields: dict[str, Any] = {"name": parameter.name, "required": required,
                              "default": None if required else parameter.default, "nullable": nullable}
    fields.update(_bounds(constraints))
    if get_origin(base) is Literal:
        return Param(kind=str, choices=tuple(get_args(base)), **fields)
    if get_origin(base) is list:
        _, item_constraints, _ = _unwrap(get_args(base)[0])
        return Param(kind=list, item_max_length=_bounds(item_constraints).get("max_length"), **fields)
    if base not in (str, int, bool):
        raise TypeError(f"tool argument {parameter.name}: unsupported type {base!r}")
    return Param(kind=base, **fields)


def _unwrap(hint: Any) -> tuple[Any, list[Any], bool]:
    """(the type without None and Annotated, the Field constraints, whether None is allowed)."""
    constraints: list[Any] = []
    nullable = False
    while True:
        if get_origin(hint) is Annotated:
            hint, *extras = get_args(hint)
            for extra in extras:
                constraints.extend(extra.metadata if isinstance(extra, FieldInfo) else [extra])
        elif get_origin(hint) in (Union, types.UnionType):
            options = [a for a in get_args(hint) if a is not type(None)]
            nullable = nullable or len(options) < len(get_args(hint))
            hint = options[0] if len(options) == 1 else hint
            if len(options) != 1:
                return hint, constraints, nullable
        else:
            return hint, constraints, nullable


def _bounds(constraints: list[Any]) -> dict[str, int]:
    bounds: dict[str, int] = {}
    for item in constraints:
        for name, kind in (("ge", annotated_types.Ge), ("le", annotated_types.Le),
                           ("min_length", annotated_types.MinLen), ("max_length", annotated_types.MaxLen)):
            if isinstance(item, kind):
                bounds[name] = getattr(item, name)
    return bounds


def usage(method: Callable[..., Any]) -> str:
    """The hint every argument error carries: the tool's arguments, which are required and their defaults."""
    parts = []
    for param in params(method):
        if param.required:
            parts.append(f"{param.name} (required)")
        elif param.default is not None:
            parts.append(f"{param.name} (default {json.dumps(param.default)})")
        else:
            parts.append(param.name)
    name = getattr(method, "__name__", "the tool")
    return f"{name} takes " + (", ".join(parts) if parts else "no arguments")


def check_arguments(method: Callable[..., Any], arguments: object,
                    positional: Sequence[object] = ()) -> dict[str, Any]:
    """The arguments as the method may take them, or ToolCallError naming the first one at fault.

    Unknown arguments are refused; null means absent only where the schema admits null (elsewhere it is a wrong
    type, like a client's unparsable value turned into null); a list may also come as a JSON string (some clients send
    lists that way); an integral number such as 5.0 counts as an integer, true never does. `positional` (a Python
    caller's) fills the arguments in their declared order."""
    hint = usage(method)
    if not isinstance(arguments, dict):
        raise ToolCallError(f"arguments must be an object, not {_kind(arguments)}", hint)
    declared = {p.name: p for p in params(method)}
    arguments = _with_positional(tuple(declared), positional, arguments, hint)
    unknown = sorted(str(name) for name in arguments if name not in declared)
    if unknown:
        raise ToolCallError(f"unknown argument(s): {', '.join(a[:40] for a in unknown[:5])}", hint)
    checked: dict[str, Any] = {}
    for param in declared.values():
        if param.name not in arguments:
            if param.required:
                raise ToolCallError(f"{param.name} is required: {param.expects()}", hint)
            continue
        value = arguments[param.name]
        if value is None and param.nullable:
            continue
        checked[param.name] = _checked(param, value, hint)
    return checked


def _with_positional(names: tuple[str, ...], positional: Sequence[object], arguments: dict[Any, Any],
                     hint: str) -> dict[Any, Any]:
    """Named arguments with the positional ones added under their declared names."""
    if len(positional) > len(names):
        raise ToolCallError(f"at most {len(names)} positional argument(s), got {len(positional)}", hint)
    twice = [name for name in names[:len(positional)] if name in arguments]
    if twice:
        raise ToolCallError(f"{twice[0]} given twice: by position and by name", hint)
    return dict(zip(names, positional, strict=False)) | arguments


def _checked(param: Param, value: object, hint: str) -> Any:
    def refuse(got: object) -> ToolCallError:
        return ToolCallError(f"{param.name} must be {param.expects()}, got {_kind(got)}", hint)

    def whole(text: str, name: str) -> str:
        if not _encodable(text):
            raise ToolCallError(f"{name} is not valid text: it holds half of a character (a lone surrogate, e.g. an "
                                "emoji cut in two); send whole characters", hint)
        return text

    if param.kind is bool:
        if not isinstance(value, bool):
            raise refuse(value)
        return value
    if param.kind is int:
        number = int(value) if isinstance(value, float) and value.is_integer() else value
        if isinstance(number, bool) or not isinstance(number, int):
            raise refuse(value)
        if (param.ge is not None and number < param.ge) or (param.le is not None and number > param.le):
            raise refuse(value)
        return number
    if param.kind is list:
        if isinstance(value, str) and value.lstrip().startswith("["):
            value = _json_list(value)
        if not isinstance(value, list):
            raise refuse(value)
        if param.max_length is not None and len(value) > param.max_length:
            raise refuse(value)
        for item in value:
            if not isinstance(item, str) or (param.item_max_length and len(item) > param.item_max_length):
                most = f" of at most {param.item_max_length} characters" if param.item_max_length else ""
                raise ToolCallError(f"each of {param.name} must be a string{most}, got {_kind(item)}", hint)
            whole(item, f"an item of {param.name}")
        return value
    if not isinstance(value, str):
        raise refuse(value)
    too_short = param.min_length is not None and len(value) < param.min_length
    if too_short or (param.max_length is not None and len(value) > param.max_length):
        raise refuse(value)
    if param.choices and value not in param.choices:
        raise ToolCallError(f"{param.name} must be {param.expects()}, got {value[:40]!r}", hint)
    return whole(value, param.name)


def _encodable(text: str) -> bool:
    """Whether the text is whole Unicode (no lone surrogate, which no UTF-8 store, model or file can take)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _json_list(text: str) -> object:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text


def _kind(value: object) -> str:
    """A value described without echoing what it holds (it may be huge or hostile)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return repr(value) if len(repr(value)) <= 24 else f"a {len(repr(value))}-digit number"
    if isinstance(value, str):
        return f"a string of {len(value)} characters"
    if isinstance(value, list):
        return f"a list of {len(value)} items"
    if isinstance(value, dict):
        return "an object"
    return "null" if value is None else type(value).__name__


def refusal(tool: str, error: str, hint: str) -> dict[str, str]:
    """The one shape of every refusal, on every path."""
    return {"error": error, "tool": tool, "hint": hint}
