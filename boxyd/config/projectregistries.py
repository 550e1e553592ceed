"""Registries a project names in its own package-tool configuration, read as data.

npm reads `.npmrc` at the project's root (its "local prefix": the nearest directory
from the current one up holding package.json or node_modules); pip reads `pip.conf`
at the root of the virtual environment it runs from. Both sit in the work directory,
which the payload can write: a `registry=https://elsewhere/` it plants there must
not open a host for the next run. So those files are parsed here with each tool's
own rules (never by running the tool with the project's configuration), and what
they name widens the allowlist only once `boxyctl trust` approved it (spec.py).

Pure: projectconfig reads the files. What npm accepts: @npmcli/config reads the file with the
`ini` package (`key = value`, `;`/`#` comments, quoted values, `key[]` arrays,
`[section]`s whose keys npm never reads as settings), then replaces `${VAR}` and
`${VAR?}` in keys and values; a scope's registry is `@scope:registry`. What pip
accepts: configparser sections `global` and one per command, option names
lower-cased with `_` as `-` and a leading `--` dropped; list options are split on
whitespace.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from boxyd.config.registries import ENV_OVERRIDES

NPMRC = ".npmrc"
PIP_CONF = "pip.conf"

# pip options that name where packages come from; the template the primary one fills
PIP_SOURCES = {"index-url": "pip_index", "extra-index-url": None, "find-links": None}
# pip commands that read an index (their sections apply to them)
PIP_COMMANDS = ("global", "install", "download", "wheel", "index", "lock")

_ENV_EXPR = re.compile(r"(?<!\\)(\\*)\$\{([^${}?]+)(\?)?\}")
_INI_LINE = re.compile(r"^\[([^\]]*)\]\s*$|^([^=]+)(=(.*))?$")


@dataclass(frozen=True)
class ProjectRegistry:
    source: str  # the file that names it
    key: str  # as the tool names it: registry, @corp:registry, global.index-url …
    url: str
    template: str | None  # the host template it stands in for; None: a host added beside it
    family: str  # "npm" or "pip": added only where the profile uses that tool's registry

    @property
    def host(self) -> str | None:
        try:
            parts = urlsplit(self.url)
        except ValueError:
            return None
        if parts.scheme not in ("http", "https") or "@" in parts.netloc:
            return None  # a file path, or credentials in the URL: never handed on
        return parts.hostname or None

    @property
    def shown(self) -> str:
        """The URL as said and recorded: credentials in it are never repeated."""
        scheme, sep, rest = self.url.partition("://")
        netloc, slash, path = rest.partition("/")
        if sep and "@" in netloc:
            return f"{scheme}://***@{netloc.rpartition('@')[2]}{slash}{path}"
        return self.url

    def wire(self) -> dict[str, str]:
        return {"source": self.source, "key": self.key, "url": self.shown}


# --- npm ---------------------------------------------------------------------------


def env_replace(text: str, env: Mapping[str, str]) -> str:
    """@npmcli/config's env-replace: ${VAR} (kept as written when unset), ${VAR?}
    (empty when unset), and backslash escapes of the `$`."""

    def sub(m: re.Match[str]) -> str:
        esc, name, optional = m.group(1), m.group(2), m.group(3)
        if len(esc) % 2:
            return m.group(0)[(len(esc) + 1) // 2 :]
        value = env.get(name, "" if optional else "${" + name + "}")
        return esc[len(esc) // 2 :] + value

    return _ENV_EXPR.sub(sub, text)


def ini_unsafe(value: str) -> tuple[str, bool]:
    """The `ini` package's value decoding, and whether the result is a JS string: a
    value that starts and ends with the same quote is JSON.parse'd (single quotes
    stripped first) and kept as written when that throws; any other is cut at the
    first unescaped ; or #. A JSON value that is not a string is taken as
    JavaScript's String() makes it, which is what npm's keys and URL checks see."""
    value = value.strip()
    if value and value[0] == value[-1] and value[0] in "\"'":
        inner = value[1:-1] if value[0] == "'" else value
        decoded = _json_parse(inner)
        if decoded is None:
            return inner, True
        return decoded
    out, esc = [], False
    for c in value:
        if esc:
            out.append(c if c in "\\;#" else "\\" + c)
            esc = False
        elif c in ";#":
            break
        elif c == "\\":
            esc = True
        else:
            out.append(c)
    if esc:
        out.append("\\")
    return "".join(out).strip(), True


# JSON.parse (ECMA-404) without recursion: Python's json module recurses once per
# '[' and raises RecursionError on a few thousand, where V8's parser does not.
# A value is (its String(), or None for null; whether it is a string).
_JSValue = tuple[str | None, bool]
_JSON_WS = re.compile(r"[ \t\n\r]*")
_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_JSON_CHARS = re.compile(r'[^"\\\x00-\x1f]*')
_JSON_ESCAPES = {
    '"': '"',
    "\\": "\\",
    "/": "/",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
}
_JSON_HEX4 = re.compile(r"[0-9A-Fa-f]{4}")
_JSON_WORDS: dict[str, _JSValue] = {
    "true": ("true", False),
    "false": ("false", False),
    "null": (None, False),
}


def _json_parse(text: str) -> tuple[str, bool] | None:
    """String(JSON.parse(TEXT)) and whether it is a string; None where JSON.parse
    throws. Linear time: an open array or object is a list entry, not a frame, and
    an array's String() is built once, in PIECES (joined at every level, an element
    was copied once per array around it)."""
    pieces: list[str] = []  # String() of the open arrays so far: elements and commas
    stack: list[tuple[bool, int]] = []  # per open container: an array?, its first piece
    pos = _ws(text, 0)
    while True:  # a value starts at POS
        value: _JSValue | None
        if text.startswith(("[", "{"), pos):
            stack.append((text[pos] == "[", len(pieces)))
            pos = _ws(text, pos + 1)
            if not text.startswith("]" if stack[-1][0] else "}", pos):
                if not stack[-1][0] and (pos := _json_key(text, pos)) < 0:
                    return None
                continue
            value, pos = _close(stack, pieces), pos + 1
        else:
            value, pos = _json_scalar(text, pos)
            if value is None:
                return None
        while True:  # VALUE ends before POS: into its container, closing those that end
            pos = _ws(text, pos)
            if not stack:
                return (
                    ("null" if value[0] is None else value[0], value[1])
                    if pos == len(text)
                    else None
                )
            in_array = stack[-1][0]
            if in_array and value[0] is not None:
                pieces.append(value[0])
            if text.startswith(",", pos):
                pos = _ws(text, pos + 1)
                if in_array:
                    pieces.append(",")
                elif (pos := _json_key(text, pos)) < 0:
                    return None
                break
            if not text.startswith("]" if in_array else "}", pos):
                return None
            value, pos = _close(stack, pieces), pos + 1


def _ws(text: str, pos: int) -> int:
    """POS past the JSON blanks there."""
    m = _JSON_WS.match(text, pos)
    return m.end() if m else pos  # always a match: the pattern matches nothing too


def _close(stack: list[tuple[bool, int]], pieces: list[str]) -> _JSValue:
    """The container atop STACK ends: String() of an object (its pieces dropped); of
    an array, its PIECES joined when it is the outermost value, else None: they stay
    where they are, in the String() of the array around it."""
    is_array, first = stack.pop()
    if not is_array:
        del pieces[first:]
        return "[object Object]", False
    return ("".join(pieces), False) if not stack else (None, False)


def _json_key(text: str, pos: int) -> int:
    """Past `"name" :` and the blanks after it; -1 when that is not at POS."""
    key, pos = _json_scalar(text, pos) if text.startswith('"', pos) else (None, pos)
    if key is None:
        return -1
    pos = _ws(text, pos)
    return _ws(text, pos + 1) if text.startswith(":", pos) else -1


def _json_scalar(text: str, pos: int) -> tuple[_JSValue | None, int]:
    """The string, number, true, false or null at POS and the position after it;
    None when there is none."""
    if text.startswith('"', pos):
        return _json_string(text, pos + 1)
    m = _JSON_NUMBER.match(text, pos)
    if m:
        return (_js_number(m.group()), False), m.end()
    for word, value in _JSON_WORDS.items():
        if text.startswith(word, pos):
            return value, pos + len(word)
    return None, pos


def _json_string(text: str, pos: int) -> tuple[_JSValue | None, int]:
    """After the opening quote: the string and the position after its closing quote."""
    out: list[str] = []
    pairs = False  # \\u escapes: JavaScript strings are UTF-16, so a pair is one character
    while True:
        m = _JSON_CHARS.match(text, pos)
        if m:  # always: the pattern matches nothing too
            out.append(m.group())
            pos = m.end()
        if text.startswith('"', pos):
            s = "".join(out)
            if pairs:
                s = s.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
            return (s, True), pos + 1
        c = text[pos + 1 : pos + 2] if text.startswith("\\", pos) else ""
        if c == "u" and _JSON_HEX4.fullmatch(text, pos + 2, pos + 6):
            out.append(chr(int(text[pos + 2 : pos + 6], 16)))
            pairs = True
            pos += 6
        elif c in _JSON_ESCAPES:  # "" (a control character, or the end) is not in it
            out.append(_JSON_ESCAPES[c])
            pos += 2
        else:
            return None, pos


def _js_number(literal: str) -> str:
    """JavaScript's Number.prototype.toString() of a JSON number literal."""
    x = float(literal)
    if x in (math.inf, -math.inf):
        return "Infinity" if x > 0 else "-Infinity"
    if x == 0:
        return "0"
    import decimal  # here: an .npmrc's rare number; at import it cost boxyd 450 KiB

    sign, digits_t, exp = decimal.Decimal(repr(abs(x))).normalize().as_tuple()
    digits = "".join(map(str, digits_t))
    k, n = len(digits), int(exp) + len(digits)  # x = 0.DIGITS × 10ⁿ
    head = "-" if x < 0 else ""
    if k <= n <= 21:
        return head + digits + "0" * (n - k)
    if 0 < n <= 21:
        return head + digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return head + "0." + "0" * -n + digits
    e = f"e{'+' if n > 0 else '-'}{abs(n - 1)}"
    return head + digits[0] + ("." + digits[1:] if k > 1 else "") + e


def parse_npmrc(text: str, env: Mapping[str, str]) -> list[tuple[str, str]]:
    """(key, url) for `registry` and every `@scope:registry` npm would read from
    this file, in file order; a later line replaces an earlier one, as in npm."""
    found: dict[str, str] = {}
    in_section = False
    for line in re.split(r"[\r\n]+", text):
        if not line.strip() or re.match(r"^\s*[;#]", line):
            continue
        m = _INI_LINE.match(line)
        if m is None:
            continue
        if m.group(1) is not None:
            in_section = True  # nested keys: npm does not read them as settings
            continue
        if in_section or m.group(3) is None:
            continue
        raw_key, key_is_string = ini_unsafe(m.group(2))
        if key_is_string and raw_key.endswith("[]") and len(raw_key) > 2:
            continue  # an array: npm's registry settings are single strings
        key = env_replace(raw_key, env)
        if key != "registry" and not (key.startswith("@") and key.endswith(":registry")):
            continue
        raw_value, value_is_string = ini_unsafe(m.group(4))
        # @npmcli/config replaces ${VAR} in strings only (a JSON array is kept as parsed)
        value = (env_replace(raw_value, env) if value_is_string else raw_value).strip()
        if value in ("", "true", "false", "null"):
            found.pop(key, None)
            continue
        found[key] = value
    return list(found.items())


# --- pip ---------------------------------------------------------------------------


def parse_pip_conf(text: str) -> list[tuple[str, str]]:
    """(section.option, url) for every index or find-links URL pip would read from
    this file for an install; a file pip itself would refuse yields nothing."""
    sections = _configparser_items(text)
    if sections is None:
        return []  # pip stops with "could not load configuration": nothing is fetched
    out: list[tuple[str, str]] = []
    for section, items in sections:
        if section not in PIP_COMMANDS:
            continue
        for name, value in items:
            option = name.lower().replace("_", "-")
            option = option[2:] if option.startswith("--") else option
            if option not in PIP_SOURCES or not value:
                continue
            urls = value.split() if PIP_SOURCES[option] is None else [value.strip()]
            out += [(f"{section}.{option}", url) for url in urls if "://" in url]
    return out


_DELIMITER = re.compile(r"[=:]")


def _configparser_items(text: str) -> list[tuple[str, list[tuple[str, str]]]] | None:
    """What configparser.RawConfigParser() (pip's) gives for TEXT: each section with
    its items() ([DEFAULT]'s under it), or None where read_string raises. The same
    rules as its _read, in linear time: its option regex ``(.*?)\\s*[=:]`` costs
    O(n²) on a long run of blanks (20 s for one 64 KiB line), and its ParsingError
    grows its message by concatenation, once per bad line."""
    defaults: dict[str, list[str]] = {}
    sections: dict[str, dict[str, list[str]]] = {}
    added: set[str | tuple[str, str]] = set()  # what strict mode refuses twice
    cursect: dict[str, list[str]] | None = None
    sectname = optname = ""
    indent_level = 0
    for line in text.split("\n"):  # io.StringIO's lines: only \n ends one
        value = line.strip()
        if value.startswith(("#", ";")):
            continue  # a comment line is not even an empty line of a value
        if not value:
            if cursect is not None and optname:
                cursect[optname].append("")
            continue
        indent = len(line) - len(line.lstrip())
        if cursect is not None and optname and indent > indent_level:
            cursect[optname].append(value)  # a continuation line
            continue
        indent_level = indent
        close = value.rfind("]")
        if value.startswith("[") and close >= 2:  # \[(.+)\] matched at the start
            sectname, optname = value[1:close], ""
            if sectname == "DEFAULT":
                cursect = defaults
            elif sectname in added:
                return None  # DuplicateSectionError
            else:
                cursect = sections.setdefault(sectname, {})
                added.add(sectname)
            continue
        delimiter = _DELIMITER.search(value)
        if cursect is None or delimiter is None or delimiter.start() == 0:
            return None  # MissingSectionHeaderError, or a ParsingError at the end
        optname = value[: delimiter.start()].rstrip().lower()
        if (sectname, optname) in added:
            return None  # DuplicateOptionError
        added.add((sectname, optname))
        cursect[optname] = [value[delimiter.end() :].strip()]
    joined = {name: "\n".join(lines).rstrip() for name, lines in defaults.items()}
    return [
        (name, list({**joined, **{k: "\n".join(v).rstrip() for k, v in opts.items()}}.items()))
        for name, opts in sections.items()
    ]


def registries(source: str, family: str, pairs: list[tuple[str, str]]) -> list[ProjectRegistry]:
    """Typed entries for one file's (key, url) pairs. pip's primary index is a
    command section's index-url over global's (pip reads [install] after [global]);
    any other index-url is a host beside it."""
    if family == "npm":
        return [
            ProjectRegistry(source, k, u, "npm_registry" if k == "registry" else None, family)
            for k, u in pairs
        ]
    indexes = [k for k, _ in pairs if k.endswith(".index-url")]
    primary = next(
        (k for k in indexes if not k.startswith("global.")), indexes[0] if indexes else None
    )
    return [
        ProjectRegistry(source, k, u, "pip_index" if k == primary else None, family)
        for k, u in pairs
    ]


def template_value(regs: list[ProjectRegistry], name: str) -> str | None:
    """What a project's registries say for template NAME (npm_registry, npm_registry_url,
    pip_index, pip_index_url), or None when they do not name it."""
    family = name.removesuffix("_url")
    for r in regs:
        if r.template == family and r.host is not None:
            return r.url if name.endswith("_url") else r.host
    return None


def resolver(
    registry: Callable[[str], str | None] | None,
    regs: Iterable[ProjectRegistry],
    client_env: Mapping[str, str],
) -> Callable[[str], str | None]:
    """REGISTRY with an approved project's registries first, as the tool orders them:
    an environment override (npm_config_registry, PIP_INDEX_URL) over the project's
    file over the user's configuration."""
    regs = list(regs)

    def resolve(name: str) -> str | None:
        overridden = any(client_env.get(v) for v in ENV_OVERRIDES.get(name, ()))
        value = None if overridden else template_value(regs, name)
        return value if value is not None else (registry(name) if registry else None)

    return resolve


def extra_hosts(regs: list[ProjectRegistry], families: set[str]) -> list[str]:
    """The hosts a project names beside its primary registry (npm scopes, pip's extra
    indexes and find-links), for the tool FAMILIES the profile reaches."""
    out: list[str] = []
    for r in regs:
        if r.family in families and r.template is None and r.host and r.host not in out:
            out.append(r.host)
    return out
