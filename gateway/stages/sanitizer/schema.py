"""Schema validation: a tool's inputSchema compiled once, with a fast path for common keywords.

Validators are compiled once per schema (cached by identity, then by canonical-JSON digest) and
report the first error in path order, with any secret in jsonschema's message redacted. No I/O.
jsonschema (with referencing and attrs, ~60 ms) is imported on the first schema compiled, not with
this module: `dharma stdio` answers `initialize` before any tool schema is seen.
"""

from __future__ import annotations

import operator
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Final

from audit.canon import NotCanonicalizable, digest
from gateway.stages.sanitizer.errors import SanitizeError, json_type_name
from gateway.stages.sanitizer.paths import format_path
from gateway.stages.sanitizer.secrets import redact_text

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError

__all__ = ["SchemaValidator", "compile_schema"]

@dataclass(frozen=True, slots=True, eq=False)
class SchemaValidator:
    """A tool's inputSchema, compiled once. `validate` raises SanitizeError on the first error."""

    digest: str
    validator: Any  # a jsonschema Validator instance
    fast: Callable[[Any], bool] | None = None  # see fast_check; True means "certainly valid"

    def validate(self, instance: Any) -> None:
        """Check `instance`; report the first error in path order (deterministic)."""
        if self.fast is not None and self.fast(instance):
            return
        import referencing.exceptions

        try:
            if self.validator.is_valid(instance):
                return
            errors: list[ValidationError] = list(self.validator.iter_errors(instance))
        except referencing.exceptions.Unresolvable as exc:
            raise SanitizeError(f"the tool's inputSchema is invalid: unresolvable $ref ({exc})", "$") from None
        first = min(errors, key=lambda e: (_sort_key(e.absolute_path), e.message))
        message = redact_text(first.message)
        if len(message) > 300:
            message = message[:297] + "..."
        raise SanitizeError(f"does not match the tool's inputSchema: {message}", format_path(first.absolute_path))


# The fast path: plain closures for the keywords most tool schemas use. It answers True only
# when jsonschema would surely say valid (drafts 6 to 2020-12); anything else (False, or None for a schema using
# other keywords) falls through to jsonschema, which also writes the error message.
_ANNOTATIONS: Final = frozenset(
    {"title", "description", "default", "examples", "$comment", "deprecated", "readOnly", "writeOnly",
     "format", "contentMediaType", "contentEncoding", "$schema", "$id", "$defs", "definitions"}
)  # fmt: skip


def _is_object(v: Any) -> bool:
    return type(v) is dict


def _is_array(v: Any) -> bool:
    return type(v) is list


def _is_string(v: Any) -> bool:
    return type(v) is str


def _is_boolean(v: Any) -> bool:
    return type(v) is bool


def _is_null(v: Any) -> bool:
    return v is None


def _is_number(v: Any) -> bool:
    return type(v) is int or type(v) is float


def _is_integer(v: Any) -> bool:
    return type(v) is int or (type(v) is float and v.is_integer())


_Check = Callable[[Any], bool]
_TYPES: Final[dict[str, _Check]] = {
    "object": _is_object, "array": _is_array, "string": _is_string, "boolean": _is_boolean,
    "null": _is_null, "number": _is_number, "integer": _is_integer,
}  # fmt: skip
_SCALARS: Final = (str, int, float, bool, type(None))
_NUMBER_OPS: Final[dict[str, Callable[[Any, Any], bool]]] = {
    "minimum": operator.ge, "maximum": operator.le, "exclusiveMinimum": operator.gt, "exclusiveMaximum": operator.lt,
}  # fmt: skip
_SIZE_OPS: Final[dict[str, tuple[type[Any], Callable[[Any, Any], bool]]]] = {  # keyword -> (instance type, test)
    "minLength": (str, operator.ge), "maxLength": (str, operator.le),
    "minItems": (list, operator.ge), "maxItems": (list, operator.le),
    "minProperties": (dict, operator.ge), "maxProperties": (dict, operator.le),
}  # fmt: skip


def _always(result: bool, v: Any) -> bool:
    return result


def _check_type(preds: tuple[_Check, ...], v: Any) -> bool:
    return any(p(v) for p in preds)


def _check_required(names: tuple[str, ...], v: Any) -> bool:
    return type(v) is not dict or all(n in v for n in names)


def _check_items(item: _Check, v: Any) -> bool:
    if type(v) is list:
        for x in v:
            if not item(x):
                return False
    return True


def _check_enum(options: tuple[Any, ...], v: Any) -> bool:
    return any(type(v) is type(o) and v == o for o in options)


def _check_number(op: Callable[[Any, Any], bool], limit: Any, v: Any) -> bool:
    return type(v) not in (int, float) or op(v, limit)


def _check_size(typ: type[Any], op: Callable[[Any, Any], bool], limit: int, v: Any) -> bool:
    return type(v) is not typ or op(len(v), limit)


def _check_pattern(rx: re.Pattern[str], v: Any) -> bool:
    return type(v) is not str or rx.search(v) is not None


def _check_properties(props: dict[str, _Check], additional: _Check | None, v: Any) -> bool:
    if type(v) is not dict:
        return True
    for k, x in v.items():
        check = props.get(k, additional)
        if check is not None and not check(x):
            return False
    return True


def _check_all(checks: tuple[_Check, ...], v: Any) -> bool:
    for check in checks:
        if not check(v):
            return False
    return True


def fast_check(schema: Any) -> _Check | None:
    """Compile a schema made only of common keywords into a predicate, or return None."""
    if schema is True or schema is False:
        return partial(_always, schema)
    if type(schema) is not dict:
        return None
    checks: list[_Check] = []
    props: dict[str, _Check] = {}
    additional: _Check | None = None
    for kw, arg in schema.items():
        if kw in _ANNOTATIONS:
            continue
        if kw == "type":
            names = [arg] if type(arg) is str else arg
            if type(names) is not list or not names or any(n not in _TYPES for n in names):
                return None
            preds = tuple(_TYPES[n] for n in names)
            checks.append(preds[0] if len(preds) == 1 else partial(_check_type, preds))
        elif kw == "properties" or kw == "additionalProperties":
            subs = arg if kw == "properties" else {"": arg}
            if type(subs) is not dict:
                return None
            for name, sub in subs.items():
                pred = fast_check(sub)
                if pred is None:
                    return None
                if kw == "properties":
                    props[name] = pred
                else:
                    additional = pred
        elif kw == "required":
            if type(arg) is not list or any(type(n) is not str for n in arg):
                return None
            checks.append(partial(_check_required, tuple(arg)))
        elif kw == "items":
            item = fast_check(arg)
            if item is None:
                return None
            checks.append(partial(_check_items, item))
        elif kw == "enum" or kw == "const":
            options = arg if kw == "enum" else [arg]
            if type(options) is not list or any(type(o) not in _SCALARS for o in options):
                return None
            checks.append(partial(_check_enum, tuple(options)))
        elif kw in _NUMBER_OPS:
            if type(arg) not in (int, float):
                return None
            checks.append(partial(_check_number, _NUMBER_OPS[kw], arg))
        elif kw in _SIZE_OPS:
            if type(arg) is not int:
                return None
            checks.append(partial(_check_size, *_SIZE_OPS[kw], arg))
        elif kw == "pattern":
            try:
                rx = re.compile(arg)
            except (re.error, TypeError):
                return None
            checks.append(partial(_check_pattern, rx))
        else:
            return None
    if props or additional is not None:
        checks.append(partial(_check_properties, props, additional))
    return checks[0] if len(checks) == 1 else partial(_check_all, tuple(checks))


def _sort_key(path: Iterable[Any]) -> tuple[tuple[int, Any], ...]:
    return tuple((0, p) if isinstance(p, int) else (1, str(p)) for p in path)


class _ValidatorCache:
    """Compiled validators by schema identity (fast path) and by canonical-JSON digest.

    A schema is treated as immutable once seen. Both maps are bounded (oldest dropped).
    """

    __slots__ = ("_by_digest", "_by_id", "maxsize")

    def __init__(self, maxsize: int = 512) -> None:
        self.maxsize = maxsize
        self._by_id: OrderedDict[int, tuple[object, SchemaValidator]] = OrderedDict()
        self._by_digest: OrderedDict[str, SchemaValidator] = OrderedDict()

    def get(self, schema: Mapping[str, Any] | bool) -> SchemaValidator:
        entry = self._by_id.get(id(schema))
        if entry is not None and entry[0] is schema:
            return entry[1]
        try:
            key = digest(dict(schema) if isinstance(schema, Mapping) else schema)
        except NotCanonicalizable as exc:
            raise SanitizeError(f"the tool's inputSchema is invalid: {exc}", "$") from None
        compiled = self._by_digest.get(key)
        if compiled is None:
            compiled = _compile(schema, key)
            self._by_digest[key] = compiled
            if len(self._by_digest) > self.maxsize:
                self._by_digest.popitem(last=False)
        self._by_id[id(schema)] = (schema, compiled)  # holding `schema` keeps its id unique
        if len(self._by_id) > self.maxsize:
            self._by_id.popitem(last=False)
        return compiled


def _compile(schema: Mapping[str, Any] | bool, key: str) -> SchemaValidator:
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import (
        Draft6Validator,
        Draft7Validator,
        Draft201909Validator,
        Draft202012Validator,
        validator_for,
    )

    if isinstance(schema, Mapping) and not isinstance(schema.get("$schema", ""), str):
        raise SanitizeError("the tool's inputSchema is invalid at $.$schema: must be a string", "$")
    try:
        cls = validator_for(schema, default=Draft202012Validator)
        cls.check_schema(schema)
        fast_drafts = (Draft6Validator, Draft7Validator, Draft201909Validator, Draft202012Validator)
        fast = fast_check(schema) if cls in fast_drafts else None
        return SchemaValidator(digest=key, validator=cls(schema), fast=fast)
    except SchemaError as exc:
        where = format_path(exc.absolute_path) if exc.absolute_path else "$"
        raise SanitizeError(f"the tool's inputSchema is invalid at {where}: {exc.message}", "$") from None
    except (AttributeError, LookupError, TypeError, ValueError) as exc:  # jsonschema choking on odd input
        raise SanitizeError(f"the tool's inputSchema is invalid: {type(exc).__name__}: {exc}", "$") from None


_VALIDATORS: Final = _ValidatorCache()


def compile_schema(schema: Mapping[str, Any]) -> SchemaValidator:
    """Compile a JSON Schema (Draft 2020-12 unless `$schema` names another draft), cached.

    Raises:
        SanitizeError: the schema itself is invalid.
    """
    if not isinstance(schema, (Mapping, bool)):
        raise SanitizeError(f"the tool's inputSchema is invalid: must be an object, got {json_type_name(schema)}", "$")
    return _VALIDATORS.get(schema)
