"""The CUDA target's kernel for a ``matmul``/``matmul_at`` segment sum: a tiled product.

A ``matmul`` is defined as a ``segreduce(sum, k, ...)`` over its m * r * k products
(:mod:`hipress.compll.frontend.check_matmul`). Here each thread block computes a tile of C
(``TM`` rows by ``TR`` columns, one thread per element, ``TM * TR`` = the block's threads;
``TR`` the least power of two >= r up to 16 where r is a constant) and walks k in steps of
:data:`TK`: the tile's slices of A and B go to shared memory by loads that are consecutive
in memory (along k for A, along m for A^T, along r for B), then every thread adds its
``TK`` products. Each element of C is the f64 sum of its f32 products in k order, the
definition's own order, whatever the tiling; an element of A or B outside its array (an
operand shorter than its matrix) reads 0 as the definition says, and k = 0 gives zeros.
Where an operand is not in memory (a map recomputed where it is read) the definition runs.
"""

from __future__ import annotations

from hipress.compll.backends.cfamily.protocol import FamilyRenderer
from hipress.compll.backends.cuda.abi import NT
from hipress.compll.ir import nodes as ir

TK = 16  # products per thread between two barriers (the k-extent of a shared tile)


def stored(f: FamilyRenderer, name: str, level: int) -> bool:
    """Whether array ``name`` is in memory at ``level`` (not recomputed where it is read)."""
    plan = f.plan
    return name in f.em.mem and not plan.is_virtual(name) and not plan.recomputed(name, level)


def tile_columns(r: ir.Expr) -> int:
    """Columns of C per tile: the least power of two >= ``r`` (at most 16) for a constant r."""
    if isinstance(r, ir.Const) and int(r.value) >= 1:
        tr = 1
        while tr < min(int(r.value), 16):
            tr *= 2
        return tr
    return 16


def render(f: FamilyRenderer, op: ir.SegReduce, level: int, out: str) -> list[str] | None:
    """The tiled kernel's lines for ``op`` (a matmul), or None where it does not apply."""
    mm = op.matmul
    if mm is None or not (stored(f, mm.a, level) and stored(f, mm.b, level)):
        return None
    ma, mb = f.em.mem[mm.a], f.em.mem[mm.b]
    m, k, r = (f.length(x) for x in (mm.m, mm.k, mm.r))
    tr = tile_columns(mm.r)
    tm = NT // tr
    if mm.at:  # A stored k x m: consecutive threads take consecutive rows of C
        a_pos = [f"const int jj = e / {tm}, ii = e % {tm};", "const int64_t ax = aj * mm + ai;"]
    else:  # A stored m x k: consecutive threads take consecutive products of a row
        a_pos = [f"const int ii = e / {TK}, jj = e % {TK};", "const int64_t ax = ai * mk + aj;"]
    return [
        "{",
        f"  const int64_t mm = {m}, mk = {k}, mr = {r};",
        f"  const int64_t la = {ma.length}, lb = {mb.length};",
        f"  const float* const ma = {ma.ptr};",
        f"  const float* const mb = {mb.ptr};",
        f"  __shared__ float hp_ta[{TK}][{tm + 1}];  /* A's slice, k-major; +1: no bank conflicts */",
        f"  __shared__ float hp_tb[{TK}][{tr}];",
        f"  const int64_t nti = (mm + {tm - 1}) / {tm}, ntc = (mr + {tr - 1}) / {tr};",
        f"  const int ti = (int)threadIdx.x / {tr}, tc = (int)threadIdx.x % {tr};",
        "  for (int64_t t = blockIdx.x; t < nti * ntc; t += gridDim.x) {",
        f"    const int64_t i0 = t / ntc * {tm}, c0 = t % ntc * {tr};",
        "    double acc = 0.0;",
        f"    for (int64_t j0 = 0; j0 < mk; j0 += {TK}) {{",
        f"      for (int e = (int)threadIdx.x; e < {tm * TK}; e += (int)blockDim.x) {{",
        *(f"        {x}" for x in a_pos[:1]),
        "        const int64_t ai = i0 + ii, aj = j0 + jj;",
        *(f"        {x}" for x in a_pos[1:]),
        "        hp_ta[jj][ii] = ai < mm && aj < mk && ax < la ? ma[ax] : 0.0f;",
        "      }",
        f"      for (int e = (int)threadIdx.x; e < {TK * tr}; e += (int)blockDim.x) {{",
        f"        const int jj = e / {tr}, cc = e % {tr};",
        "        const int64_t bj = j0 + jj, bc = c0 + cc, bx = bj * mr + bc;",
        "        hp_tb[jj][cc] = bj < mk && bc < mr && bx < lb ? mb[bx] : 0.0f;",
        "      }",
        "      __syncthreads();",
        f"      const int jn = mk - j0 < {TK} ? (int)(mk - j0) : {TK};",
        "      for (int jj = 0; jj < jn; jj++) acc += (double)(hp_ta[jj][ti] * hp_tb[jj][tc]);",
        "      __syncthreads();",
        "    }",
        "    const int64_t i = i0 + ti, c = c0 + tc;",
        f"    if (i < mm && c < mr) {out}[i * mr + c] = (float)acc;",
        "  }",
        "}",
    ]
