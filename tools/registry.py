"""Typed Python functions as tools: `@tool` builds an OpenAI-style schema from the signature
and docstring, and `Tool.validate` checks a call's arguments against that schema.

Schema shape (OpenAI chat-completions `tools=` entry, also what Hugging Face chat templates take)::

    {"type": "function",
     "function": {"name": "search",
                  "description": "Search the corpus.",
                  "parameters": {"type": "object",
                                 "properties": {"query": {"type": "string", "description": "..."}},
                                 "required": ["query"]}}}

Type hints map to JSON schema types: `str` -> string, `int` -> integer, `float` -> number,
`bool` -> boolean, `list[X]` -> array of X, `dict` -> object, `Literal[...]` -> enum,
`X | None` -> X or null. Parameter descriptions come from the docstring's Google-style `Args:`
section; the tool description is the docstring's text before its first section.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Union

JSON = dict[str, Any]


class ToolError(Exception):
    """Raised by a tool to report a failure to the agent (the message becomes the observation)."""


class ToolArgumentError(ToolError):
    """The arguments of a call do not match the tool's schema."""


_SIMPLE_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters|Returns|Return|Raises|Yields|Examples?|Notes?)\s*:\s*$")


def type_to_schema(tp: Any) -> JSON:
    """JSON schema of a Python type hint.

    Raises:
        TypeError: a hint with no JSON equivalent (e.g. a class instance type).
    """
    if tp is inspect.Parameter.empty or tp is Any:
        return {}
    if tp in _SIMPLE_TYPES:
        return {"type": _SIMPLE_TYPES[tp]}
    if tp is list or tp is tuple:
        return {"type": "array"}
    if tp is dict:
        return {"type": "object"}
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return {"enum": list(args)}
    if origin in (list, tuple, Sequence, Iterable):
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            args = args[:1]
        return {"type": "array", "items": type_to_schema(args[0])} if len(args) == 1 else {"type": "array"}
    if origin in (dict, Mapping):
        return {"type": "object"}
    if origin is Union or origin is types.UnionType:
        non_null = [a for a in args if a is not type(None)]
        if len(non_null) == 1 and len(args) == 2:
            inner = type_to_schema(non_null[0])
            if "type" in inner and isinstance(inner["type"], str):
                return {**inner, "type": [inner["type"], "null"]}
            return {"anyOf": [inner, {"type": "null"}]}
        return {"anyOf": [type_to_schema(a) for a in args]}
    raise TypeError(f"type hint {tp!r} has no JSON schema equivalent")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into (description, {parameter: description}).

    The description is the text before the first section header (`Args:`, `Returns:`, ...),
    with its lines joined. Parameter lines look like `name: text` or `name (type): text`;
    indented continuation lines are appended.
    """
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    desc: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    indent: int | None = None  # indentation of parameter lines in the Args section
    for line in lines:
        m = _SECTION.match(line)
        if m:
            section, current, indent = m.group(1).lower(), None, None
            continue
        if section is None:
            desc.append(line.strip())
        elif section in ("args", "arguments", "parameters") and line.strip():
            width = len(line) - len(line.lstrip())
            if indent is None:
                indent = width
            pm = re.match(r"^\s*(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", line)
            if width <= indent and pm:
                current = pm.group(1).lstrip("*")
                params[current] = pm.group(2).strip()
            elif current:
                params[current] = (params[current] + " " + line.strip()).strip()
    description = re.sub(r"\s+", " ", " ".join(desc)).strip()
    return description, params


@dataclass
class Tool:
    """A callable tool: the function, its name, description and JSON-schema parameters.

    Calling the Tool calls the function. `schema` is the OpenAI-style `{"type": "function", ...}`
    entry; `validate(args)` returns the checked arguments or raises `ToolArgumentError`.
    """

    fn: Callable[..., Any]
    name: str
    description: str
    parameters: JSON = field(default_factory=lambda: {"type": "object", "properties": {}})

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    @property
    def schema(self) -> JSON:
        return {"type": "function",
                "function": {"name": self.name, "description": self.description,
                             "parameters": self.parameters}}

    def validate(self, arguments: Any) -> dict[str, Any]:
        """Check `arguments` against the parameter schema.

        Safe coercions only: an integral float (`3.0`) for an integer parameter becomes `3`,
        an integer for a number parameter becomes a float. Nothing else is converted (`"3"`
        stays a string and is rejected for an integer).

        Returns:
            the arguments to call the function with (a new dict).
        Raises:
            ToolArgumentError: not a dict, unknown or missing parameter, or a wrong type; the
                message names the parameter and the expected type.
        """
        if not isinstance(arguments, dict):
            raise ToolArgumentError(
                f"arguments of {self.name!r} must be a JSON object, got {_json_type(arguments)}")
        props: dict[str, JSON] = self.parameters.get("properties", {})
        unknown = [k for k in arguments if k not in props]
        if unknown:
            raise ToolArgumentError(
                f"unknown argument(s) {', '.join(map(repr, unknown))} for {self.name!r}; "
                f"expected: {', '.join(props) or 'none'}")
        missing = [k for k in self.parameters.get("required", []) if k not in arguments]
        if missing:
            raise ToolArgumentError(
                f"missing required argument(s) {', '.join(map(repr, missing))} for {self.name!r}")
        return {k: _check_value(v, props[k], f"{self.name}.{k}") for k, v in arguments.items()}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _check_value(value: Any, schema: JSON, where: str) -> Any:
    """Validate (and safely coerce) one value against a schema built by `type_to_schema`."""
    if not schema:
        return value
    if "enum" in schema:
        if value not in schema["enum"]:
            raise ToolArgumentError(f"{where} must be one of {schema['enum']!r}, got {value!r}")
        return value
    if "anyOf" in schema:
        for option in schema["anyOf"]:
            try:
                return _check_value(value, option, where)
            except ToolArgumentError:
                continue
        raise ToolArgumentError(f"{where}: {_json_type(value)} matches none of the allowed types")
    expected = schema.get("type")
    allowed = expected if isinstance(expected, list) else [expected]
    got = _json_type(value)
    if got in allowed:
        if got == "array" and "items" in schema:
            return [_check_value(v, schema["items"], f"{where}[{i}]") for i, v in enumerate(value)]
        return value
    if "integer" in allowed and got == "number" and float(value).is_integer():
        return int(value)
    if "number" in allowed and got == "integer":
        return float(value)
    raise ToolArgumentError(f"{where} must be {' or '.join(map(str, allowed))}, got {got} {value!r}")


def schema_from_function(fn: Callable[..., Any]) -> tuple[str, JSON]:
    """(description, parameters schema) of a typed function; see the module docstring.

    Raises:
        TypeError: `*args`/`**kwargs` parameters, or a hint with no JSON schema equivalent.
    """
    description, param_docs = parse_docstring(inspect.getdoc(fn))
    hints = typing.get_type_hints(fn)
    props: JSON = {}
    required: list[str] = []
    for name, p in inspect.signature(fn).parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"tool {fn.__name__!r}: *args/**kwargs parameters have no schema")
        prop = dict(type_to_schema(hints.get(name, inspect.Parameter.empty)))
        if name in param_docs:
            prop["description"] = param_docs[name]
        if p.default is inspect.Parameter.empty:
            required.append(name)
        elif isinstance(p.default, str | int | float | bool) or p.default is None:
            prop["default"] = p.default
        props[name] = prop
    params: JSON = {"type": "object", "properties": props}
    if required:
        params["required"] = required
    return description, params


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None,
         description: str | None = None) -> Any:
    """Decorator turning a typed function into a `Tool` (usable as `@tool` or `@tool(name=...)`).

    Args:
        fn: the function (given when used as bare `@tool`).
        name: tool name shown to the agent (default: the function's name).
        description: overrides the docstring description.

    Returns:
        a `Tool` (callable like the function), or a decorator when `fn` is None.

    Raises:
        TypeError: see `schema_from_function`.
    """
    def wrap(f: Callable[..., Any]) -> Tool:
        desc, params = schema_from_function(f)
        return Tool(fn=f, name=name or f.__name__, description=description or desc, parameters=params)

    return wrap(fn) if fn is not None else wrap


def as_tool(obj: Tool | Callable[..., Any]) -> Tool:
    """A `Tool` as is, or a plain typed function made into one."""
    return obj if isinstance(obj, Tool) else tool(obj)


class ToolSet:
    """An ordered name -> Tool mapping (the tools one env offers).

    Raises:
        ValueError: two tools with the same name.
    """

    def __init__(self, tools: Iterable[Tool | Callable[..., Any]] = ()):
        self._tools: dict[str, Tool] = {}
        for t in tools:
            self.add(t)

    def add(self, t: Tool | Callable[..., Any]) -> Tool:
        t = as_tool(t)
        if t.name in self._tools:
            raise ValueError(f"duplicate tool name {t.name!r}")
        self._tools[t.name] = t
        return t

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    def __iter__(self):
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def schemas(self) -> list[JSON]:
        """OpenAI-style schemas, in registration order (the `tools=` list of a chat template)."""
        return [t.schema for t in self._tools.values()]
