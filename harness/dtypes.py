"""Dtype names the case format accepts, known without importing torch.

The parent validates case files at collection time, where torch must not be imported, so the
set of dtype names lives here. Whether the installed torch actually has a dtype is checked at
run time (a missing one is a skip with the reason, not an error).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["bool", "uint", "int", "float", "float8", "complex", "object"]


@dataclass(frozen=True)
class DtypeInfo:
    """What the harness needs to know about a dtype before torch is loaded."""

    name: str  # torch attribute name
    short: str  # used in test ids
    kind: Kind
    bits: int
    mantissa_bits: int = 0  # significand precision p for floats (exact sums stay below 2**p)


DTYPES: dict[str, DtypeInfo] = {
    d.name: d
    for d in [
        DtypeInfo("bool", "bool", "bool", 8),
        DtypeInfo("uint8", "u8", "uint", 8),
        DtypeInfo("uint16", "u16", "uint", 16),
        DtypeInfo("uint32", "u32", "uint", 32),
        DtypeInfo("uint64", "u64", "uint", 64),
        DtypeInfo("int8", "i8", "int", 8),
        DtypeInfo("int16", "i16", "int", 16),
        DtypeInfo("int32", "i32", "int", 32),
        DtypeInfo("int64", "i64", "int", 64),
        DtypeInfo("float16", "f16", "float", 16, 11),
        DtypeInfo("bfloat16", "bf16", "float", 16, 8),
        DtypeInfo("float32", "f32", "float", 32, 24),
        DtypeInfo("float64", "f64", "float", 64, 53),
        DtypeInfo("complex64", "c64", "complex", 64, 24),
        DtypeInfo("complex128", "c128", "complex", 128, 53),
        DtypeInfo("float8_e4m3fn", "f8e4m3fn", "float8", 8, 4),
        DtypeInfo("float8_e5m2", "f8e5m2", "float8", 8, 3),
        DtypeInfo("float8_e4m3fnuz", "f8e4m3fnuz", "float8", 8, 4),
        DtypeInfo("float8_e5m2fnuz", "f8e5m2fnuz", "float8", 8, 3),
        # Not a torch dtype: the buffers of the object collectives (Python objects).
        DtypeInfo("object", "object", "object", 0),
    ]
}

ALIASES: dict[str, str] = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float": "float32",
    "fp64": "float64",
    "double": "float64",
    "long": "int64",
    "int": "int32",
    "cfloat": "complex64",
    "cdouble": "complex128",
}


def canonical(name: str) -> str | None:
    """The torch name for ``name`` (an alias or a torch name), or None if unknown."""
    if name in DTYPES:
        return name
    return ALIASES.get(name)


def info(name: str) -> DtypeInfo:
    """Info for a canonical dtype name."""
    return DTYPES[name]


REDUCE_OPS = ("sum", "product", "min", "max", "band", "bor", "bxor", "avg", "premul_sum")
