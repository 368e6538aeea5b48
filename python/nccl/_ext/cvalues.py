"""Python values into C integers, refused where ctypes would cut them silently (an int past its C type wraps) or
fail with its own error (a float or a string where an integer goes): NcclInvalidArgument naming the argument."""

from __future__ import annotations

import ctypes
import functools
import operator

from .errors import NcclInvalidArgument

_INTEGER_CODES = set("bBhHiIlLqQ")  # ctypes' simple integer types (c_size_t and c_ssize_t are aliases of these)


def is_integer_type(ctype) -> bool:
    return isinstance(ctype, type) and issubclass(ctype, ctypes._SimpleCData) and ctype._type_ in _INTEGER_CODES


@functools.lru_cache(maxsize=None)
def integer_range(ctype) -> tuple[int, int]:
    bits = 8 * ctypes.sizeof(ctype)
    if ctype._type_.islower():  # b h i l q: signed
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


def c_integer(value, ctype, name: str) -> int:
    """`value` as an int that `ctype` holds unchanged (bools and integer-like objects: operator.index)."""
    if isinstance(value, ctypes._SimpleCData):
        value = value.value
    try:
        v = operator.index(value)
    except TypeError:
        raise NcclInvalidArgument("%s=%r: an integer is expected" % (name, value)) from None
    lo, hi = integer_range(ctype)
    if not lo <= v <= hi:
        raise NcclInvalidArgument("%s=%d: outside what the C library takes (%d..%d)" % (name, v, lo, hi))
    return v


def c_integers(values, ctype, name: str) -> list[int]:
    """Each of `values` through c_integer, named name[i]."""
    return [c_integer(v, ctype, "%s[%d]" % (name, i)) for i, v in enumerate(values)]


def _integer_params(fn) -> tuple:
    """(index, ctype) of each integer parameter of C function `fn`, worked out from its argtypes once and kept on
    the function object (the loader sets argtypes when it loads a library, before any call)."""
    try:
        return fn._nccl_integer_params
    except AttributeError:
        pass
    params = tuple((i, t) for i, t in enumerate(getattr(fn, "argtypes", None) or ()) if is_integer_type(t))
    try:
        fn._nccl_integer_params = params
    except AttributeError:  # a callable that takes no attributes: worked out at every call
        pass
    return params


def checked_args(fn, name: str, args) -> tuple:
    """The arguments of a call of C function `fn` (its argtypes set): every one whose parameter is an integer type
    through c_integer, the others as given. A function without integer parameters (dispatch, combine) costs one
    attribute lookup."""
    params = _integer_params(fn)
    if not params:
        return args
    out = list(args)
    for i, t in params:
        if i < len(out):
            out[i] = c_integer(out[i], t, "%s argument %d" % (name, i + 1))
    return tuple(out)


def set_fields(struct, what: str, **fields) -> None:
    """setattr for each of `fields` on a ctypes Structure, each integer field's value through c_integer (named
    what.field)."""
    types = dict((f[0], f[1]) for f in type(struct)._fields_)
    for k, v in fields.items():
        t = types.get(k)
        setattr(struct, k, c_integer(v, t, "%s.%s" % (what, k)) if t is not None and is_integer_type(t) else v)
