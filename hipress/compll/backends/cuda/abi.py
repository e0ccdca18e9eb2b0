"""What the CUDA kernels and the host code that runs them agree on.

:mod:`hipress.compll.backends.cuda.render` renders kernels and describes them with these types;
:mod:`hipress.compll.backends.cuda.backend` (the backend) and the runtimes (:mod:`hipress.compll.backends.cuda.runtime`,
:mod:`hipress.compll.backends.cuda.emu`) read them, and never the renderer: the argument structs (8-byte
fields only), each entry point's launches, workspace layout and slot count, block size.
"""

from __future__ import annotations

from dataclasses import dataclass

NT = 256  # threads per block (shared arrays are sized by it)
SUM_PAYLOADS = 32  # payload pointers per hp_decode_sum launch
SYNC_BYTES = 64  # the block counter at the head of every workspace, then the slots


@dataclass(frozen=True)
class Field:
    """One field of an argument struct: 8 bytes (``code``: struct format "q", "Q" or "d"), or
    an array of ``count`` such elements."""

    name: str
    ctype: str
    code: str = "Q"
    count: int = 0  # 0: not an array

    @property
    def size(self) -> int:
        """Elements it holds."""
        return max(1, self.count)


def struct_fields(kind: str, nstate: int = 0, nws: int = 0) -> tuple[Field, ...]:
    """The fields of the argument struct of ``kind``: "enc", "dec", "dsum" or "sparse"."""
    common = (Field("ws", "uint8_t*"), Field("sc", "uint64_t*"), Field("sync", "unsigned int*"))
    if kind == "enc":
        return (
            Field("n", "int64_t", "q"), Field("grad", "const float*"), Field("out", "uint8_t*"),
            *common, Field("nonfinite", "uint8_t*"), Field("seed", "uint64_t"),
            Field("step", "uint64_t"), Field("tensor_id", "uint64_t"),
            Field("state", "void*", "Q", max(1, nstate)),
            Field("wsoff", "int64_t", "q", max(1, nws)),
        )  # fmt: skip
    if kind == "dec":
        return (
            Field("n", "int64_t", "q"), Field("payload", "const uint8_t*"),
            Field("out", "float*"), *common, Field("wsoff", "int64_t", "q", max(1, nws)),
        )  # fmt: skip
    if kind == "dsum":
        return (
            Field("n", "int64_t", "q"), Field("out", "float*"), Field("k", "int64_t", "q"),
            Field("cont", "int64_t", "q"), Field("divisor", "double", "d"), Field("pays", "const uint8_t*", "Q", SUM_PAYLOADS),
        )  # fmt: skip
    if kind == "sparse":
        return (
            Field("n", "int64_t", "q"), Field("out", "float*"),
            Field("payload", "const uint8_t*"), *common, Field("r", "int64_t", "q"),
            Field("mode", "int64_t", "q"), Field("divisor", "double", "d"),
        )  # fmt: skip
    raise ValueError(f"unknown argument struct {kind!r}")


STRUCTS = {"enc": "hp_enc_args", "dec": "hp_dec_args", "dsum": "hp_dsum_args",
           "sparse": "hp_sparse_args"}  # fmt: skip


@dataclass(frozen=True)
class WsEntry:
    """A workspace array: ``length`` elements (an IR length, or an int) of ``item`` bytes (a
    negative ``item``: packed, ``-item`` bits each); with ``per_block``, ``per_block`` elements
    per block of the launch instead."""

    length: object
    item: int
    per_block: int = 0


@dataclass(frozen=True)
class Launch:
    """One step of an entry point: a kernel on the grid ("grid") or on one thread ("one"), or
    a host step ("host": ``host`` says which)."""

    kernel: str
    grid: str = "grid"
    host: dict[str, object] | None = None


@dataclass(frozen=True)
class Entry:
    """An entry point (``hp_encode``, ``hp_decode``, ``hp_decode_acc``): its argument struct,
    launches, workspace layout, slot count, and (encode) whether it reports NaN/Inf."""

    struct: str
    launches: tuple[Launch, ...]
    workspace: tuple[WsEntry, ...]
    slots: int
    nonfinite: bool = False


@dataclass(frozen=True)
class CudaSource:
    """Rendered CUDA C and what the host side needs to run it (see module doc)."""

    source: str
    entries: dict[str, Entry]
    structs: dict[str, tuple[Field, ...]]
    decode_sum: bool  # hp_decode_sum exists (a decode that is one map over its output)
    sparse: bool  # the hp_sparse_* kernels exist
    kernels: dict[str, str]  # every kernel -> the name of its argument struct


__all__ = [
    "NT",
    "STRUCTS",
    "SUM_PAYLOADS",
    "SYNC_BYTES",
    "CudaSource",
    "Entry",
    "Field",
    "Launch",
    "WsEntry",
    "struct_fields",
]
