"""JSON text from the job definition, read and written within one depth limit (pure): the
one rule config.py and v3_definition.py both read their files by.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Mapping


# How deep a JSON value from the job definition may nest (arrays and objects within each
# other). SageMaker caps a hyperparameter value at 2,500 characters: at most 1,250 levels, so
# every value SageMaker can hand us is within it. json's C code recurses once a level, counted
# against the interpreter's recursion limit (1,000, less what the stack already holds), so
# decode_json and build_json give it room for this many levels whatever the stack above; a
# walk of our own over such a value is a loop (measure_json_depth), never a recursion.
JSON_DEPTH_LIMIT = 1250
# Recursion units per level json may use: one in the C scanner and encoder, a few in the pure
# Python encoder that `indent` selects (a generator a level).
_JSON_UNITS_PER_LEVEL = 3


class JsonTooDeep(ValueError):
    """A JSON text or value nested deeper than JSON_DEPTH_LIMIT."""


def _with_json_room(call, *args, **kwargs):
    """call(...) with recursion room for a JSON_DEPTH_LIMIT-deep value; RecursionError (a
    deeper text) becomes JsonTooDeep."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(limit + _JSON_UNITS_PER_LEVEL * JSON_DEPTH_LIMIT)
    try:
        return call(*args, **kwargs)
    except RecursionError:
        raise JsonTooDeep(f"nested more than {JSON_DEPTH_LIMIT} levels deep") from None
    finally:
        sys.setrecursionlimit(limit)


def measure_json_depth(value: Any) -> int:
    """How many arrays/objects deep value nests (0: a scalar), by a loop: any depth."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        deepest = max(deepest, depth + 1)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def decode_json(text: str) -> Any:
    """json.loads for text from the job definition: at most JSON_DEPTH_LIMIT levels (a deeper
    text raises JsonTooDeep, a ValueError), whatever the stack above."""
    value = _with_json_room(json.loads, text)
    if measure_json_depth(value) > JSON_DEPTH_LIMIT:
        raise JsonTooDeep(f"nested more than {JSON_DEPTH_LIMIT} levels deep")
    return value


def _plain(value: Any) -> Any:
    """json's `default`: a frozen mapping (MappingProxyType) as the object it stands for."""
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def build_json(value: Any, **options: Any) -> str:
    """json.dumps for values from the job definition, frozen mappings included, with room for
    JSON_DEPTH_LIMIT levels beneath whatever holds them (SM_TRAINING_ENV adds two)."""
    return _with_json_room(json.dumps, value, default=options.pop("default", _plain), **options)


def canonical_json(value: Any) -> str:
    """The toolkit's rendering of a non-string value: compact, sorted keys, ASCII."""
    return build_json(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
