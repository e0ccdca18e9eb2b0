"""Lowering: the plan is immutable, each pass returns a new plan, and a program is lowered once
per function and variant, above the renderers (which are given the plans)."""

from __future__ import annotations

import dataclasses

import pytest

from hipress.compll import load
from hipress.compll.backends.cfamily import bits, syntax
from hipress.compll.backends.targets import lowered, render
from hipress.compll.ir import ops
from hipress.compll.lower import lower as lower_mod
from hipress.compll.lower.finite import NONFINITE, add_flag
from hipress.compll.lower.fuse import fuse
from hipress.compll.lower.lower import lower, lower_program


def test_plan_is_immutable() -> None:
    plan = lower(load("onebit", backend="reference").program, "encode")
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.fusions = ()  # type: ignore[misc]
    with pytest.raises(TypeError):
        plan.homes["x"] = plan.homes[next(iter(plan.homes))]  # type: ignore[index]
    st = plan.steps[0]
    assert isinstance(plan.steps, tuple) and isinstance(st.loops, tuple)
    assert isinstance(st.loops[0].items, tuple) and isinstance(plan.ws, tuple)
    with pytest.raises(dataclasses.FrozenInstanceError):
        st.loops[0].items = ()  # type: ignore[misc]


def test_passes_return_new_plans_and_leave_their_input() -> None:
    prog = load("onebit", backend="reference").program
    plain = lower(prog, "encode")
    before = plain.steps
    flagged = add_flag(plain, prog)
    assert flagged is not plain and flagged.nonfinite == NONFINITE
    assert plain.nonfinite is None and plain.steps is before  # the input is as it was
    items = [len(lp.items) for st in plain.steps for lp in st.loops]
    after = [len(lp.items) for st in flagged.steps for lp in st.loops]
    assert sum(after) == sum(items) + 1  # one reduction more, in a loop of its own level
    assert fuse(plain) == plain  # already fused: the same plan again
    decode = lower(prog, "decode")
    assert add_flag(decode, prog) is decode  # only an encode reports NaN/Inf


def test_add_flag_replaces_the_loop_in_the_fusions_that_run_it() -> None:
    # dgc's flag goes to the loop of the maps deferred to its filter (unfused: CUDA)
    prog = load("dgc", backend="reference").program
    plan = lower(prog, "encode", nonfinite=True, unfused=True)
    steps = {id(lp) for st in plan.steps for lp in st.loops}
    assert all(id(f.loop) in steps for f in plan.filter_fusions)
    assert plan.nonfinite == NONFINITE


@pytest.mark.parametrize("target", ["c", "cuda"])
def test_a_program_is_lowered_once_per_function_and_variant(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    prog = load("topk", backend="reference").program
    calls: list[tuple[str, bool]] = []
    real = lower_mod.lower

    def counting(p, fn, accumulate=False, **options):  # type: ignore[no-untyped-def]
        calls.append((fn, accumulate))
        return real(p, fn, accumulate, **options)

    monkeypatch.setattr(lower_mod, "lower", counting)
    text = render(prog, target)
    assert sorted(calls) == [("decode", False), ("decode", True), ("encode", False)]
    monkeypatch.undo()
    assert text == render(prog, target)


def test_lowered_plans_per_target() -> None:
    prog = load("dgc", backend="reference").program
    c, cuda = lowered(prog, "c"), lowered(prog, "cuda")
    assert c == lower_program(prog) and cuda == lower_program(prog, unfused=True)
    assert c.decode_acc.accumulate and not c.decode.accumulate
    assert c.sparse is not None  # dgc decodes sparse pairs


def test_every_operation_has_a_c_rule() -> None:
    """The C-family operation table covers every unary and binary operation of the IR (the
    bit casts, ldexp and hash by the bits module)."""
    assert set(ops.UNARY) == set(syntax.UNARY) | set(bits.UNARY)
    assert set(ops.BINARY) == set(syntax.BINARY) | {ops.LDEXP.name, ops.HASH.name}
