"""The CUDA target's ``block(...)`` section (see :mod:`hipress.compll.ir.blocks`): one grid piece
in which each thread block takes a tile of whole blocks of B elements at a time (B elements, or
as many blocks of B as fit in the block's threads when B is smaller), keeps every array of the
section for the tile in ``__shared__`` memory and every per-block value (a segment reduction)
in a shared slot, with ``__syncthreads()`` between the section's ops. The section reads the
gradient and state once and writes its outputs once; what it computes in between stays on chip.

A read of a section array goes through the masked index the checker wrote (the element's own
block, else -1, which reads 0): a read whose index falls outside the tile reads 0, so the
kernel computes the definition without trusting anything but the mask. Tile slots past an
array's length hold 0, as a read past the end gives.

A segment reduction combines each thread's partial over the threads of its block: a tree when
that count is a power of two, else one thread in index order, with the same accumulators (f64
for float sums) as every other reduction of the target.

A section whose shared arrays would exceed :data:`SHARED_LIMIT` bytes (48 KB, what a kernel may
declare statically on every GPU the target supports) is not made a section kernel: it runs as
ordinary passes over global memory (:func:`too_big`)."""

from __future__ import annotations

from hipress.compll.backends.cfamily.body import Body
from hipress.compll.backends.cfamily.reduce import combine_acc, reduction
from hipress.compll.backends.cfamily.syntax import ctype
from hipress.compll.backends.cuda.abi import NT
from hipress.compll.backends.cuda.stages import CudaRenderer
from hipress.compll.ir import nodes as ir
from hipress.compll.ir.blocks import defines, reads
from hipress.compll.ir.types import DType
from hipress.compll.lower.kernel_plan import Special

SHARED_LIMIT = 48 * 1024  # bytes of static __shared__ memory a section kernel may declare


def tile_elements(size: int) -> int:
    """The elements a thread block holds at a time: ``size`` (B >= the block's threads), else
    as many whole blocks of ``size`` as there are threads for."""
    return size if size >= NT else size * (NT // size)


def _count(op: ir.Block, x: ir.Op) -> int:
    te = tile_elements(op.size)
    return te if isinstance(x, ir.Map) else te // op.size


def buffers(op: ir.Block) -> tuple[list[tuple[DType, int]], list[int | None]]:
    """The shared arrays of section ``op`` (element type, count) and the one each of its ops
    writes (None: no later op of the section reads it). An array is reused once no later op
    reads the value in it; an op never writes an array it reads."""
    last: dict[str, int] = {}
    for k, x in enumerate(op.ops):
        for name in reads(x):
            last[name] = k
    bufs: list[tuple[DType, int]] = []
    holder: dict[int, str] = {}  # buffer -> the array in it
    which: list[int | None] = []
    for k, x in enumerate(op.ops):
        name = defines(x)
        assert name is not None
        if last.get(name, -1) <= k:
            which.append(None)
            continue
        dt = x.type.dtype if isinstance(x, ir.Map) else x.dtype  # type: ignore[union-attr]
        want = (dt, _count(op, x))
        free = [b for b, nm in holder.items() if bufs[b] == want and last[nm] < k]
        b = free[0] if free else len(bufs)
        if not free:
            bufs.append(want)
        holder[b] = name
        which.append(b)
    return bufs, which


def shared_bytes(op: ir.Block) -> int:
    """The ``__shared__`` bytes the section kernel of ``op`` declares."""
    bufs, _ = buffers(op)
    total = sum(dt.nbytes * k for dt, k in bufs)
    # a segment reduction's partials: at most two 8-byte accumulators per thread
    return total + sum(NT * 16 for x in op.ops if isinstance(x, ir.SegReduce))


def too_big(op: ir.Block) -> bool:
    """Whether section ``op`` runs as ordinary passes (its arrays do not fit in shared memory)."""
    return shared_bytes(op) > SHARED_LIMIT


def passes(prog: ir.Program) -> ir.Program:
    """``prog`` with each section that is :func:`too_big` replaced by its ops (the same object
    when there is none)."""

    def ops_(seq: tuple[ir.Op, ...]) -> tuple[ir.Op, ...]:
        out: list[ir.Op] = []
        for op in seq:
            big = isinstance(op, ir.Block) and too_big(op)
            out += list(op.ops) if big else [op]  # type: ignore[union-attr]
        return tuple(out)

    if not any(isinstance(op, ir.Block) and too_big(op)
               for op in (*prog.encode.ops, *prog.decode.ops)):  # fmt: skip
        return prog
    enc = ir.Encode(prog.encode.grad, ops_(prog.encode.ops), prog.encode.fields)
    dec = ir.Decode(prog.decode.payload, ops_(prog.decode.ops), prog.decode.result)
    return ir.Program(prog.name, prog.doc, prog.params, prog.state, prog.payload, enc, dec)


def _reader(buf: str, dt: ir.DType, f: CudaRenderer, te: int, per_block: int):
    """The read rule of a section array kept in ``buf``: the masked index, relative to the
    tile (``per_block``: B for a per-block array, else 0); outside the tile, 0."""

    def read(x: ir.Load, body: Body, env: dict[str, str]) -> str:
        j = f.em.expr(x.index, body, env)
        k = f.names.fresh("bk")
        base = f"hp_t0 / {per_block}" if per_block else "hp_t0"
        cap = te // per_block if per_block else te
        body.lines.append(f"const int64_t {k} = (int64_t)({j}) - {base};")
        ok = f"((uint64_t){k} < (uint64_t){cap})"
        return f"({ok} ? {buf}[{ok} ? {k} : 0] : ({ctype(dt)})0)"

    return read


def _body(f: CudaRenderer, fn: ir.Lambda, length: ir.Expr, lv: int, hoist: list[str]):
    """``fn``'s statements and result at element ``i``; its loop-invariant code goes to
    ``hoist`` (run once, before the tiles)."""
    body = Body(level=lv, index="i", loop_len=length)
    v = f.em.apply(fn, ["i"], body)
    hoist += body.hoist
    return body, v


def _map(
    f: CudaRenderer, x: ir.Map, buf: str | None, te: int, lv: int, hoist: list[str]
) -> list[str]:
    """One map of the section over the tile's elements, into its shared array (and home)."""
    body, v = _body(f, x.fn, x.type.length, lv, hoist)
    dt = x.type.dtype
    st = [f"const {ctype(dt)} hp_x = {v};"] + ([f"{buf}[e] = hp_x;"] if buf else [])
    home = f.plan.homes.get(x.name)
    if home is not None:
        st.append(f.store(home, f.plan.arrays[x.name].dtype, "hp_x"))
    return [
        "{",
        f"  const int64_t hp_ln = {f.length(x.type.length)};",
        f"  for (int e = (int)threadIdx.x; e < {te}; e += (int)blockDim.x) {{",
        "    const int64_t i = hp_t0 + e;",
        "    if (i < hp_ln) {",
        *(f"      {ln}" for ln in [*body.lines, *st]),
        f"    }} else {buf}[e] = ({ctype(dt)})0;" if buf else "    }",
        "  }",
        "}",
        "__syncthreads();",
    ]


def _combine(comb: str, per: int) -> list[str]:
    """Combine the partials ``sh[t]`` of each group of ``per`` threads into the group's first."""
    if per & (per - 1) == 0:
        return [
            f"for (int s = {per // 2}; s > 0; s >>= 1) {{",
            f"  if ((int)threadIdx.x % {per} < s) {{ {comb} }}",
            "  __syncthreads();",
            "}",
        ]
    return [  # one thread per block, in index order
        f"if ((int)threadIdx.x % {per} == 0 && (int)threadIdx.x < {NT // per * per}) {{",
        f"  for (int s = 1; s < {per}; s++) {{ {comb} }}",
        "}",
        "__syncthreads();",
    ]


def _segreduce(f: CudaRenderer, x: ir.SegReduce, sv: str | None, size: int, te: int, lv: int,
               hoist: list[str]) -> list[str]:  # fmt: skip
    """Per block of the tile: the reduction into slot ``sv[q]`` (0 past the reduction's end)."""
    body, v = _body(f, x.fn, x.length, lv, hoist)
    red = reduction(x.op, v, x.fn.result.dtype, x.dtype, f"(int64_t){size}", f.names)
    per = min(size, NT)  # the threads that share one block
    out = ["{", f"  const int64_t hp_ln = {f.length(x.length)};"]
    out += [f"  {a.ctype} {a.name} = {a.init};" for a in red.accs]
    # thread t works on block (t / per) of the tile: elements t, t + NT, ... of it
    out += [
        f"  if ((int)threadIdx.x < {te if size < NT else NT}) {{",
        f"    const int64_t hp_q0 = hp_t0 + (int64_t)((int)threadIdx.x / {per}) * {size};",
        f"    const int64_t hp_q1 = hp_q0 + {size} < hp_ln ? hp_q0 + {size} : hp_ln;",
        f"    for (int64_t i = hp_q0 + (int)threadIdx.x % {per}; i < hp_q1; i += {per}) {{",
        *(f"      {ln}" for ln in [*body.lines, *red.update]),
        "    }",
        "  }",
    ]
    nb = te // size
    for a in red.accs:
        sh = f.names.fresh("hp_sh")
        comb = combine_acc(a, f"{sh}[threadIdx.x]", f"{sh}[threadIdx.x + s]")
        out += [f"  __shared__ {a.ctype} {sh}[{NT}];", f"  {sh}[threadIdx.x] = {a.name};",
                "  __syncthreads();"]  # fmt: skip
        out += [f"  {ln}" for ln in _combine(comb, per)]
        out += [f"  {a.name} = {sh}[(int)threadIdx.x / {per} * {per}];", "  __syncthreads();"]
    home = f.plan.homes.get(x.name)
    out += [
        f"  if ((int)threadIdx.x % {per} == 0 && (int)threadIdx.x / {per} < {nb}) {{",
        f"    const int64_t hp_q = hp_t0 / {size} + (int)threadIdx.x / {per};",
        f"    const {ctype(x.dtype)} hp_v = hp_q * {size} < hp_ln ? "
        f"({ctype(x.dtype)})({red.final}) : ({ctype(x.dtype)})0;",
    ]
    if sv is not None:
        out.append(f"    {sv}[(int)threadIdx.x / {per}] = hp_v;")
    if home is not None:
        line = f.store(home, f.plan.arrays[x.name].dtype, "hp_v")
        out.append(f"    if (hp_q * {size} < hp_ln) {{ const int64_t i = hp_q; {line} }}")
    return [*out, "  }", "}", "__syncthreads();"]


def render_block(f: CudaRenderer, sp: Special) -> None:
    """The section ``sp`` as one grid piece (see the module doc)."""
    op = sp.op
    assert isinstance(op, ir.Block)
    size, lv = op.size, sp.level
    te = tile_elements(size)
    bufs, which = buffers(op)
    names = [f.names.fresh("hp_sm") for _ in bufs]
    decl = [f"__shared__ {ctype(dt)} {v}[{k}];" for (dt, k), v in zip(bufs, names, strict=True)]
    lengths = [f.length(x.type.length if isinstance(x, ir.Map) else x.length) for x in op.ops]
    parts: list[str] = []
    hoist: list[str] = []
    for x, b in zip(op.ops, which, strict=True):
        var = names[b] if b is not None else None
        if isinstance(x, ir.Map):
            parts += _map(f, x, var, te, lv, hoist)
        else:
            assert isinstance(x, ir.SegReduce)
            parts += _segreduce(f, x, var, size, te, lv, hoist)
        if var is not None:  # later ops read it from there
            dt = bufs[b][0]  # type: ignore[index]
            f.em.local[x.name] = _reader(var, dt, f, te, size if isinstance(x, ir.SegReduce) else 0)
    for x in op.ops:
        f.em.local.pop(x.name, None)
    longest = lengths[0]
    for ln in lengths[1:]:
        longest = f"({ln} > {longest} ? {ln} : {longest})"
    code = [
        *hoist,
        "{",
        *(f"  {d}" for d in decl),
        f"  const int64_t hp_bl = {longest}, hp_nt = (hp_bl + {te - 1}) / {te};",
        "  for (int64_t hp_tile = blockIdx.x; hp_tile < hp_nt; hp_tile += gridDim.x) {",
        f"    const int64_t hp_t0 = hp_tile * {te};",
        *(f"    {ln}" for ln in parts),
        "  }",
        "}",
    ]
    f.piece(f"level {lv}: block({size}) section of {len(op.ops)} ops in shared memory", code)
