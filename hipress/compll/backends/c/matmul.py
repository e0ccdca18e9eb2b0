"""The C target's matrix-product kernel for a ``matmul``/``matmul_at`` segment sum.

A ``matmul`` is defined as a ``segreduce(sum, k, ...)`` over its m * r * k products
(:mod:`hipress.compll.frontend.check_matmul`); rendered as that, every product is a gather
through two divisions and each row of A is read once per column of C from scattered places.
Here both operands are read in order: ``matmul`` transposes B (k x r, small) into the workspace
and makes four columns of C per pass over a row of A, one SIMD reduction each; ``matmul_at``
reads A (k x m) row by row once and accumulates every column of C in a block of rows kept in
cache, each thread over its share of k, then adds the threads' partial sums. Products are f32
and sums f64 as the definition says; only the order of the f64 additions differs, which the
language leaves open for float sums. Where an operand is recomputed rather than stored, or
shorter than its matrix (its missing elements read 0), the elementwise definition runs.
"""

from __future__ import annotations

from hipress.compll.backends.cfamily.protocol import FamilyRenderer
from hipress.compll.ir import nodes as ir

BLOCK = 256  # rows of C (matmul_at) accumulated together: 256 x r doubles per thread in cache


def stored(f: FamilyRenderer, name: str, level: int) -> bool:
    """Whether array ``name`` is in memory at ``level`` (not recomputed where it is read)."""
    plan = f.plan
    return name in f.em.mem and not plan.is_virtual(name) and not plan.recomputed(name, level)


def render(f: FamilyRenderer, op: ir.SegReduce, level: int, out: str, generic: str) -> str:
    """The kernel for ``op`` (a matmul), falling back to ``generic`` (its segment sum)."""
    mm = op.matmul
    if mm is None or not (stored(f, mm.a, level) and stored(f, mm.b, level)):
        return generic
    ma, mb = f.em.mem[mm.a], f.em.mem[mm.b]
    m, k, r = (f.length(x) for x in (mm.m, mm.k, mm.r))
    if mm.at:  # one partial C (r x m doubles) per thread
        scratch = f.scratch("double", f"(int64_t)nt * {m} * {r}")
    else:  # B transposed
        scratch = f.scratch("float", f"{k} * {r}")
    indented = "\n".join("    " + ln if ln else ln for ln in generic.rstrip("\n").split("\n"))
    return f.env.get_template("c_matmul.c.j2").render(
        level=level, out_name=op.name, at=mm.at, m=m, k=k, r=r, a=ma.ptr, b=mb.ptr,
        la=ma.length, lb=mb.length, out=out, scratch=scratch, generic=indented, block=BLOCK,
    )  # fmt: skip
