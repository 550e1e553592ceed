"""The varlink IDL, parsed: the interface's types and methods, and a check of a
value against a declared type. The server checks every call's parameters with it
(a missing or wrongly typed one is InvalidParameter before any handler runs), and
the conformance test checks every reply; the .varlink file is the one contract.

The grammar is varlink's (https://varlink.org/Interface-Definition): `type`,
`method`, `error`; the types bool, int, float, string, object, `?T` (nullable),
`[]T` (array), `[string]T` (map), `(a: T, …)` (struct), `(a, b)` (enum), names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_TOKEN = re.compile(r"\s*(#[^\n]*|->|\[string\]|\[\]|[()?:,]|[A-Za-z_][A-Za-z0-9_.]*)")
BASIC = frozenset({"bool", "int", "float", "string", "object"})


@dataclass(frozen=True)
class Type:
    """NAME: a basic type or a declared one; ARRAY/MAP: its element is ITEM;
    FIELDS: an inline struct; ENUM: its values."""

    name: str = ""
    nullable: bool = False
    array: bool = False
    map: bool = False
    item: Type | None = None
    fields: tuple[tuple[str, Type], ...] | None = None
    enum: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Method:
    name: str
    params: tuple[tuple[str, Type], ...]
    returns: tuple[tuple[str, Type], ...]


@dataclass(frozen=True)
class Interface:
    name: str
    types: dict[str, Type]
    methods: dict[str, Method]
    errors: dict[str, tuple[tuple[str, Type], ...]]


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = [t for t in _TOKEN.findall(text) if not t.startswith("#")]
        rest = _TOKEN.sub("", text)
        if rest.strip():
            raise ValueError(f"varlink IDL: unexpected {rest.strip()[:20]!r}")
        self.i = 0

    def peek(self) -> str:
        return self.tokens[self.i] if self.i < len(self.tokens) else ""

    def take(self, want: str | None = None) -> str:
        tok = self.peek()
        if not tok or (want is not None and tok != want):
            raise ValueError(f"varlink IDL: expected {want or 'more'}, got {tok!r}")
        self.i += 1
        return tok

    def struct(self) -> Type:
        """After "(": a struct, or an enum (names without types)."""
        fields: list[tuple[str, Type]] = []
        names: list[str] = []
        while self.peek() != ")":
            name = self.take()
            if self.peek() == ":":
                self.take(":")
                fields.append((name, self.type()))
            else:
                names.append(name)
            if self.peek() == ",":
                self.take(",")
        self.take(")")
        if names and fields:
            raise ValueError("varlink IDL: an enum with typed fields")
        return Type(enum=tuple(names)) if names else Type(fields=tuple(fields))

    def type(self) -> Type:
        tok = self.take()
        if tok == "?":
            inner = self.type()
            return Type(
                inner.name, True, inner.array, inner.map, inner.item, inner.fields, inner.enum
            )
        if tok == "[]":
            return Type(array=True, item=self.type())
        if tok == "[string]":
            return Type(map=True, item=self.type())
        if tok == "(":
            return self.struct()
        return Type(tok)

    def fields(self) -> tuple[tuple[str, Type], ...]:
        self.take("(")
        t = self.struct()
        if t.enum:
            raise ValueError("varlink IDL: parameters must be typed")
        return t.fields or ()


def parse(text: str) -> Interface:
    p = _Parser(text)
    p.take("interface")
    iface = Interface(p.take(), {}, {}, {})
    while p.peek():
        what, name = p.take(), p.take()
        if what == "type":
            p.take("(")
            iface.types[name] = p.struct()
        elif what == "method":
            params = p.fields()
            p.take("->")
            iface.methods[name] = Method(name, params, p.fields())
        elif what == "error":
            iface.errors[name] = p.fields()
        else:
            raise ValueError(f"varlink IDL: unknown declaration {what!r}")
    return iface


def check(iface: Interface, t: Type, value: Any, where: str) -> str | None:
    """None when VALUE is a T; else where it is not (the parameter's path)."""
    if value is None:
        return None if t.nullable else where
    if t.array:
        if not isinstance(value, list):
            return where
        return _first(check(iface, t.item, v, f"{where}[{i}]") for i, v in enumerate(value))  # type: ignore[arg-type]
    if t.map:
        if not isinstance(value, dict):
            return where
        return _first(check(iface, t.item, v, f"{where}.{k}") for k, v in value.items())  # type: ignore[arg-type]
    if t.enum is not None:
        return None if value in t.enum else where
    if t.fields is not None:
        return check_fields(iface, t.fields, value, where)
    if t.name in BASIC:
        return None if _basic(t.name, value) else where
    return check(iface, iface.types[t.name], value, where)


def check_fields(
    iface: Interface, fields: tuple[tuple[str, Type], ...], value: Any, where: str = ""
) -> str | None:
    """A struct (a call's parameters, a reply): every field it requires, each of its
    type, and no field it does not declare."""
    if not isinstance(value, dict):
        return where or "parameters"
    declared = dict(fields)
    for key in value:
        if key not in declared:
            return f"{where}.{key}" if where else key
    for name, t in fields:
        bad = check(iface, t, value.get(name), f"{where}.{name}" if where else name)
        if bad is not None:
            return bad
    return None


def _basic(name: str, v: Any) -> bool:
    if name == "bool":
        return isinstance(v, bool)
    if name == "int":
        return isinstance(v, int) and not isinstance(v, bool)
    if name == "float":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if name == "string":
        return isinstance(v, str)
    return isinstance(v, dict)  # object: any JSON object


def _first(items: Any) -> str | None:
    return next((x for x in items if x is not None), None)
