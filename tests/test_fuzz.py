"""Fuzzing the compiler and the inputs a user controls.

- Sources (tests/cll_gen.py): token-level mutations of the shipped algorithms and of generated
  programs are refused with a located CllError (``path:line:col``, the line, a caret) and
  nothing else, in bounded time and memory; a mutant that is accepted renders for both targets
  and runs on the reference interpreter.
- Generated well-typed programs are accepted and give the reference interpreter's payload
  bytes, state and decodes on the C backend and on the CUDA kernels under the emulation runtime,
  at n = 0, 1, 9, 33 and 16411 (past the size where the C loops run on threads).
- ``load(name, **params)`` with arbitrary values, ``Plan.from_json`` with arbitrary and mutated
  plans, and ``State.load_state_dict`` with mutated checkpoints either work or raise their typed
  error (CllParamError, PlanError, ValueError/TypeError).

A short run is part of the test suite. The long run scales every example count (the ones that
compile kernels by a tenth and a fiftieth of it)::

    HIPRESS_FUZZ_EXAMPLES=5000 .venv/bin/python -m pytest -q tests/test_fuzz.py

A failure prints the program (or value) hypothesis found, already shrunk; the hypothesis
database (.hypothesis/) replays it first on the next run.
"""

from __future__ import annotations

import json
import math
import os
import resource
import time
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from cll_gen import mutants, programs
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from test_native import run_both

from hipress.compll import Algorithm, algorithms, load, load_source, shipped_path
from hipress.compll.backends.c.native import NativeBackend
from hipress.compll.backends.cache import KernelCache, Toolchain
from hipress.compll.backends.cuda.emu import CxxToolchain, emulated_backend
from hipress.compll.backends.targets import render
from hipress.compll.frontend.check import check_source
from hipress.compll.ir import nodes as cir
from hipress.compll.ir.interp import eval_size
from hipress.compll.ir.payload import layout
from hipress.compll.ir.source import CllError, CllParamError, SourceFile
from hipress.compll.ir.types import ArrayType
from hipress.core.plan import Plan, PlanError

FUZZ = int(os.environ.get("HIPRESS_FUZZ_EXAMPLES", "0"))
CPU_LIMIT_S, WALL_LIMIT_S = 5.0, 30.0  # per input: check and render (not kernel builds)
MEMORY_LIMIT = 1 << 30  # growth of the process's peak resident memory per input
SIZES = (0, 1, 9, 33, 16411)  # the last past PAR_MIN: the C loops run on threads
SHIPPED = {name: Path(shipped_path(name)).read_text() for name in algorithms()}
TOOLCHAIN = Toolchain.detect()
CXX = CxxToolchain.detect()


def _examples(short: int, share: float = 1.0) -> int:
    """``short`` in the normal run; ``share`` of HIPRESS_FUZZ_EXAMPLES in a long run."""
    return max(short, int(FUZZ * share)) if FUZZ else short


def _settings(short: int, share: float = 1.0) -> Callable[[Any], Any]:
    return settings(max_examples=_examples(short, share), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])  # fmt: skip


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> KernelCache:
    """Kernels of generated programs go to a temporary cache, not the user's."""
    return KernelCache(tmp_path_factory.mktemp("fuzz-kernels"))


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _bounded(fn: Callable[[], Any]) -> Any:
    """``fn()``, which must cost under CPU_LIMIT_S of CPU time (a blow-up), return within
    WALL_LIMIT_S (a hang; generous, so a busy machine does not fail it) and not grow the peak
    memory by more than MEMORY_LIMIT (raises what ``fn`` raises)."""
    t, cpu, rss = time.perf_counter(), time.process_time(), _peak_rss()
    try:
        return fn()
    finally:
        took, used = time.perf_counter() - t, time.process_time() - cpu
        assert used < CPU_LIMIT_S and took < WALL_LIMIT_S, f"took {took:.1f} s ({used:.1f} s CPU)"
        assert _peak_rss() - rss < MEMORY_LIMIT, "peak memory grew by more than 1 GiB"


def assert_located(exc: CllError, src: SourceFile) -> None:
    """``exc`` renders as ``path:line:col: ...``, the source line and a caret under the span
    (or, for a whole-file problem, ``path: ...``)."""
    msg = str(exc)
    assert msg.startswith(f"{src.path}:"), msg
    sp = exc.span
    if sp is None or sp.line == 0:
        assert "at most 64 KiB" in msg, f"an error without a position: {msg}"
        return
    parts = msg.split("\n")
    assert len(parts) == 3, msg
    head, line, caret = parts
    assert head.startswith(f"{src.path}:{sp.line}:{sp.col}: "), msg
    assert 1 <= sp.line <= src.text.count("\n") + 1, msg
    text = src.line(sp.line).expandtabs(1)
    assert 1 <= sp.col <= len(text) + 1, f"column {sp.col} is past the line: {msg}"
    assert line.endswith(text) and caret.rstrip().endswith(("^", "~")), msg
    assert caret.index("^") == len(line) - len(text) + sp.col - 1, msg


# ---------------------------------------------------------------- sizes of accepted programs


def _lengths(program: cir.Program) -> list[cir.Expr]:
    out = [
        s.type.length for s in (*program.state, *program.payload) if isinstance(s.type, ArrayType)
    ]
    for op in (*program.encode.ops, *program.decode.ops):
        if isinstance(op, cir.Map):
            out.append(op.type.length)
        out += [getattr(op, a) for a in ("length", "bound", "k", "seg") if hasattr(op, a)]
    return out


def _small(program: cir.Program, n: int, limit: int = 1 << 22) -> bool:
    """Whether every array an accepted mutant makes for ``n`` elements is reasonably small."""
    return all(eval_size(e, n) <= limit for e in _lengths(program)) and \
        layout(program, n)[1] <= 4 * limit  # fmt: skip


def _run_reference(alg: Algorithm, n: int) -> None:
    x = torch.linspace(-2, 3, n)
    st_ = alg.init_state(n, seed=3)
    p = alg.encode(x, st_)
    alg.encode(x, st_)
    assert p.numel() == alg.payload_nbytes(n)
    assert alg.decode(p, n).shape == (n,)


# ---------------------------------------------------------------- mutated sources


def _check_mutant(text: str) -> None:
    src = SourceFile("fuzz.cll", text)
    try:
        prog = _bounded(lambda: check_source(src))
    except CllError as exc:
        assert_located(exc, src)
        return
    _bounded(lambda: (render(prog, "c"), render(prog, "cuda")))
    alg = load_source(src, backend="reference")
    for n in (1, 9, 33):
        if _small(prog, n):
            _run_reference(alg, n)


@_settings(250, 1.0)
@given(data=st.data(), name=st.sampled_from(sorted(SHIPPED)))
def test_mutated_shipped_algorithms(data: st.DataObject, name: str) -> None:
    text = data.draw(mutants(SHIPPED[name]), label="mutant")
    _check_mutant(text)


@_settings(100, 1.0)
@given(data=st.data(), prog=programs())
def test_mutated_generated_programs(data: st.DataObject, prog: tuple[str, dict]) -> None:
    text = data.draw(mutants(prog[0]), label="mutant")
    _check_mutant(text)


# ---------------------------------------------------------------- generated programs


EXPONENTS = {"nice": (-12, 6), "tiny": (-149, -140), "huge": (100, 118)}


@st.composite
def gradients(draw: st.DrawFn) -> Callable[[int], torch.Tensor]:
    """A recipe for a gradient of any size: values k * 2^e (every f64 sum of them is exact,
    see tests/test_native.py) in one regime, or all equal, or zeros of both signs; maybe with
    NaN/Inf/-0, maybe in f16/bf16."""
    regime = draw(st.sampled_from(sorted(EXPONENTS)))
    pattern = draw(st.sampled_from(["mixed", "mixed", "equal", "zero"]))
    specials = draw(st.booleans())
    dtype = draw(st.sampled_from([torch.float32, torch.float32, torch.float16, torch.bfloat16]))
    seed = draw(st.integers(0, 2**16))

    def make(n: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed + n)
        k = torch.randint(-1024, 1025, (n,), generator=g).double()
        lo, hi = EXPONENTS[regime]
        e = torch.randint(lo, hi + 1, (n,), generator=g).double()
        x = (k * torch.pow(2.0, e)).float()
        if pattern == "equal" and n:
            x = x[:1].expand(n).clone()
        elif pattern == "zero":
            x = torch.where(k > 0, 0.0, -0.0).float()
        if specials and n:
            for j, v in zip((0, n // 2, n - 1, n // 3), (math.nan, math.inf, -0.0, -math.inf),
                            strict=True):  # fmt: skip
                x[j] = v
        return x.to(dtype)

    return make


def _accepted(text: str, params: dict) -> Algorithm:
    """The reference algorithm of a generated program, which must be accepted and render."""
    note(text)
    note(f"params: {params}")
    src = SourceFile("gen.cll", text)
    ref = _bounded(lambda: load_source(src, backend="reference", **params))
    _bounded(lambda: (render(ref.program, "c"), render(ref.program, "cuda")))
    return ref


@pytest.mark.skipif(TOOLCHAIN is None, reason="no C compiler")
@_settings(15, 0.1)
@given(prog=programs(), grad=gradients())
def test_generated_programs_on_c_equal_reference(
    prog: tuple[str, dict], grad: Callable[[int], torch.Tensor], cache: KernelCache
) -> None:
    ref = _accepted(*prog)
    assert TOOLCHAIN is not None
    cpu = Algorithm(ref.program, NativeBackend(ref.program, cache, TOOLCHAIN))
    for n in SIZES:
        run_both(ref, cpu, grad(n), steps=2)


@pytest.mark.skipif(CXX is None, reason="no C++ compiler")
@_settings(3, 0.02)
@given(prog=programs(), grad=gradients())
def test_generated_programs_on_emulated_cuda_equal_reference(
    prog: tuple[str, dict], grad: Callable[[int], torch.Tensor], cache: KernelCache
) -> None:
    ref = _accepted(*prog)
    emu = Algorithm(ref.program, emulated_backend(ref.program, blocks=3, shuffle=True,
                                                  cache=cache))  # fmt: skip
    for n in SIZES:
        run_both(ref, emu, grad(n), steps=2)


# ---------------------------------------------------------------- load(name, **params)

ODD_VALUES = [np.float32(0.5), np.int64(2), np.bool_(True), np.float64(0.01), torch.tensor(2),
              torch.tensor(0.5), Fraction(1, 2), Decimal("0.5"), 1 + 2j, [1], {"a": 1}, b"1",
              "0.5", "2", object(), 10**400, -(10**400), 2**63, 2**64 + 1, 1e-46, 5e-324,
              float("nan"), float("inf"), -float("inf"), -0.0]  # fmt: skip
VALUES = st.one_of(st.integers(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=4),
                   st.none(), st.booleans(), st.sampled_from(ODD_VALUES))  # fmt: skip
DECLARED = {name: dict(load(name, backend="reference").params) for name in SHIPPED}


@_settings(150, 1.0)
@given(data=st.data(), name=st.sampled_from(sorted(SHIPPED)))
def test_load_with_arbitrary_parameter_values(data: st.DataObject, name: str) -> None:
    declared = DECLARED[name]
    keys = st.sampled_from(sorted(declared)) if declared else st.nothing()
    other = st.text(min_size=1, max_size=6).filter(lambda k: k not in ("backend", "name"))
    names = data.draw(st.lists(st.one_of(keys, other), max_size=3, unique=True), label="names")
    params = {k: data.draw(VALUES, label=k) for k in names}
    try:
        alg = load(name, backend="reference", **params)
    except CllParamError as exc:
        assert str(exc).startswith(f"{shipped_path(name)}:"), str(exc)
        assert "parameter" in exc.message
        return
    for k, v in params.items():
        got, default = alg.params[k], declared[k]
        assert type(got) is type(default), (k, v, got)
        if isinstance(default, float):
            assert got == float(np.float32(v)) or got == float(v), (k, v, got)
        else:
            assert got == v, (k, v, got)
    _run_reference(alg, 9)


# ---------------------------------------------------------------- Plan.from_json

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c,
                                                                        max_size=3),
                    max_leaves=12)  # fmt: skip


@st.composite
def valid_plans(draw: st.DrawFn) -> dict[str, Any]:
    entries = []
    for j in range(draw(st.integers(0, 3))):
        strategy = draw(st.sampled_from(["allreduce", "allgather", "ps", "ring"]))
        entries.append({"name": f"layer{j}.weight", "numel": draw(st.integers(0, 10**6)),
                        "compress": strategy != "allreduce", "strategy": strategy,
                        "partitions": draw(st.integers(1, 8)), "predicted_ms": 1.5,
                        "uncompressed_ms": 2.0})  # fmt: skip
    return {"algorithm": "topk", "params": {"ratio": 0.01}, "world_size": draw(st.integers(1, 64)),
            "entries": entries, "totals": {"planned": 3.0}, "meta": {"planner": "fuzz"}}  # fmt: skip


@st.composite
def mutated_plans(draw: st.DrawFn) -> str:
    d = draw(valid_plans())
    for _ in range(draw(st.integers(1, 3))):
        entries = d.get("entries")
        holders = (
            [d, *(e for e in entries if isinstance(e, dict))] if isinstance(entries, list) else [d]
        )
        at = draw(st.sampled_from(holders))
        key = draw(st.sampled_from([*sorted(at), "extra"])) if at else "extra"
        if draw(st.booleans()) and key in at:
            del at[key]
        else:
            at[key] = draw(st.one_of(JSON, st.sampled_from([-1, 0, 2**63, 2**64, 1e300, "ring",
                                                            "allreduce", True, [], {}])))  # fmt: skip
    text = json.dumps(d)
    if draw(st.booleans()):  # and a text-level edit
        j = draw(st.integers(0, len(text)))
        edit = draw(st.sampled_from(["", "{", "]", ",", '"', "NaN", "-"]))
        text = text[:j] + edit + text[j + 1 :]
    return text


@_settings(300, 1.0)
@given(text=st.one_of(JSON.map(json.dumps), mutated_plans(), st.text(max_size=80)))
def test_plan_from_json_gives_a_plan_or_plan_error(text: str) -> None:
    try:
        plan = Plan.from_json(text)
    except PlanError:
        return
    for e in plan.entries:
        assert isinstance(e.numel, int) and e.numel >= 0 and e.partitions >= 1
        assert e.compress == (e.strategy.value != "allreduce")
    assert isinstance(plan.world_size, int) and plan.world_size >= 0


@pytest.mark.parametrize("case", ["huge-integer", "pairs"])
def test_plan_from_json_refuses_json_limits_and_pairs(case: str) -> None:
    d = {"algorithm": "topk", "params": {}, "world_size": 2, "entries": []}
    if case == "huge-integer":
        with pytest.raises(PlanError):
            Plan.from_json(json.dumps(d)[:-1] + ', "x": ' + "1" * 5000 + "}")
        return
    d["params"] = [[1, 2], ["a", 3]]
    try:
        plan = Plan.from_json(json.dumps(d))
    except PlanError:
        return
    assert Plan.from_json(plan.to_json()).digest() == plan.digest()


# ---------------------------------------------------------------- State.load_state_dict

STATEFUL = ("onebit", "topk", "dgc", "terngrad")
N_STATE = 10


def _odd_tensor(draw: Callable[..., Any], like: torch.Tensor) -> object:
    kind = draw(st.sampled_from(["shape+1", "shape-1", "0d", "2d", "dtype", "strided", "list",
                                 "none", "same", "nan"]))  # fmt: skip
    n = like.numel()
    if kind == "shape+1":
        return torch.zeros(n + 1, dtype=like.dtype)
    if kind == "shape-1":
        return torch.zeros(max(0, n - 1), dtype=like.dtype)
    if kind == "0d":
        return torch.zeros((), dtype=like.dtype)
    if kind == "2d":
        return torch.zeros(n, 1, dtype=like.dtype)
    if kind == "dtype":
        dt = draw(st.sampled_from([torch.float64, torch.float16, torch.int32, torch.int64,
                                   torch.bool, torch.uint8, torch.complex64]))  # fmt: skip
        return torch.ones(like.shape, dtype=dt)
    if kind == "strided":
        return torch.ones((*like.shape, 2), dtype=like.dtype)[..., 0]
    if kind == "list":
        return like.tolist()
    if kind == "none":
        return None
    if kind == "nan" and like.is_floating_point():
        return torch.full_like(like, math.nan)
    return like.clone()


@_settings(200, 1.0)
@given(data=st.data(), name=st.sampled_from(STATEFUL))
def test_state_load_state_dict_refuses_or_keeps_the_shapes(data: st.DataObject, name: str) -> None:
    alg = load(name, backend="reference")
    donor = alg.init_state(N_STATE, seed=1)
    alg.encode(torch.linspace(-1, 1, N_STATE), donor)
    sd = donor.state_dict()
    for _ in range(data.draw(st.integers(1, 3))):
        what = data.draw(st.sampled_from(["counter", "delete", "tensors", "entry", "add", "drop"]))
        if what == "counter":
            key = data.draw(st.sampled_from(["n", "step", "seed", "tensor_id"]))
            sd[key] = data.draw(st.one_of(VALUES, st.integers(0, 2**70)))
        elif what == "delete" and sd:
            sd.pop(data.draw(st.sampled_from(sorted(sd))))
        elif what == "tensors":
            sd["tensors"] = data.draw(st.one_of(JSON, st.just([])))
        elif isinstance(sd.get("tensors"), dict) and sd["tensors"]:
            tensors = dict(sd["tensors"])
            key = data.draw(st.sampled_from(sorted(tensors)))
            if what == "entry" and isinstance(tensors[key], torch.Tensor):
                tensors[key] = _odd_tensor(data.draw, tensors[key])
            elif what == "add":
                tensors["residual" if data.draw(st.booleans()) else "extra"] = torch.zeros(N_STATE)
            else:
                del tensors[key]
            sd["tensors"] = tensors
    st_ = alg.init_state(N_STATE)
    before = {k: (v.shape, v.dtype, v.device) for k, v in st_.tensors.items()}
    try:
        st_.load_state_dict(sd)
    except (ValueError, TypeError):
        return
    assert {k: (v.shape, v.dtype, v.device) for k, v in st_.tensors.items()} == before
    for key in ("step", "seed", "tensor_id"):
        v = getattr(st_, key)
        assert type(v) is int and v >= 0, (key, v)
    # the restored state runs, and the C kernel agrees with the reference on it
    if TOOLCHAIN is not None:
        cpu = load(name, backend="cpu")
        st2 = alg.init_state(N_STATE)
        st2.load_state_dict(sd)
        x = torch.linspace(-3, 2, N_STATE)
        assert torch.equal(alg.encode(x, st_), cpu.encode(x, st2))


@pytest.mark.parametrize("kind", ["meta", "sparse"])
def test_state_load_state_dict_refuses_entries_without_values(kind: str) -> None:
    alg = load("dgc", backend="reference")
    st_ = alg.init_state(N_STATE)
    sd = st_.state_dict()
    assert list(sd["tensors"])[:2] == ["u", "comp"]
    sd["tensors"]["u"] = torch.ones(N_STATE)
    bad = (
        torch.zeros(N_STATE, device="meta") if kind == "meta" else torch.zeros(N_STATE).to_sparse()
    )
    sd["tensors"]["comp"] = bad
    with pytest.raises((ValueError, TypeError)):
        st_.load_state_dict(sd)
    assert torch.equal(st_.tensors["u"], torch.zeros(N_STATE))  # all or nothing
