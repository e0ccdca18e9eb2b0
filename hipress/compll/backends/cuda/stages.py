"""The CUDA target's stages of their own, as pieces of kernels (see
:mod:`hipress.compll.backends.cuda.render`): one rule per stage kind (:data:`STAGES`), each a
function of the :class:`~hipress.compll.backends.cuda.render.CudaFunction` rendering it and the
stage. Sort and top-k end in a host step; a scan and a custom reduction run on one thread."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Protocol

from hipress.compll.backends.cfamily.body import Body
from hipress.compll.backends.cfamily.protocol import FamilyRenderer
from hipress.compll.backends.cfamily.reduce import combine_acc, minmax_identity, reduction
from hipress.compll.backends.cfamily.syntax import ctype, mtype, scatter_combine
from hipress.compll.backends.cuda import matmul
from hipress.compll.backends.cuda.abi import WsEntry
from hipress.compll.ir import nodes as ir
from hipress.compll.ir import ops
from hipress.compll.ir.types import BOOL, I64, DType
from hipress.compll.lower.kernel_plan import Destination, ScatterAdd, Special


class CudaRenderer(FamilyRenderer, Protocol):
    """What the rules use of the :class:`~hipress.compll.backends.cuda.render.CudaFunction`
    calling them, besides what every C-family function has."""

    def slot(self, name: str, dt: DType) -> int: ...

    def store_scalar(self, name: str, value: str) -> str: ...

    def piece(self, title: str, code: list[str], produced: set[str] | frozenset[str] = frozenset(),
              grid: bool = True, scalar: bool = False) -> None: ...  # fmt: skip

    def host_step(self, kind: str, step: dict[str, object]) -> None: ...


StageRule = Callable[[CudaRenderer, Special], None]


def _start(f: CudaRenderer, sp: Special, kind: type | tuple[type, ...]) -> tuple[Any, int, str]:
    """The stage's op (an instance of ``kind``), level and output pointer ("" where none)."""
    home = f.target_ptr(sp.home) if sp.home is not None else ""
    if not isinstance(sp.op, kind):  # pragma: no cover - STAGES dispatches on the type
        raise TypeError(f"not a {kind}: {sp.op!r}")
    return sp.op, sp.level, home


def _filter(f: CudaRenderer, sp: Special) -> None:
    op, lv, home = _start(f, sp, ir.Filter)
    body = Body(level=lv, index="j", loop_len=op.length)
    res = f.em.apply(op.pred, ["j"], body)
    counts = f.scratch("int64_t", "0", WsEntry(0, 8, 2))
    slot = f.slot(op.count, I64)
    tpl = f.env.get_template("cuda_filter.cu.j2")
    kw = {"length": f.length(op.length), "bound": f.length(op.bound), "body": body.lines,
          "result": res, "counts": counts, "idx": home, "slot": slot,
          "count": f.names.get(op.count)}  # fmt: skip
    f.piece("filter: counts", body.hoist + tpl.render(phase=0, **kw).splitlines())
    f.piece("filter: offsets", tpl.render(phase=1, **kw).splitlines(), {op.count}, False)
    f.piece("filter: ordered writes", body.hoist + tpl.render(phase=2, **kw).splitlines())


def _select(f: CudaRenderer, sp: Special) -> None:
    """Sort and top-k: their keys by the grid, then a host step (torch ops on the device)."""
    op, lv, _ = _start(f, sp, (ir.TopK, ir.Sort))
    fn = op.key
    kdt = fn.result.dtype
    ku = "uint64_t" if kdt.bits == 64 else "uint32_t"
    body = Body(level=lv, index="j", loop_len=op.length)
    res = f.em.apply(fn, ["j"], body)
    kb = 8 if ku == "uint64_t" else 4
    keys = f.scratch(ku, f.length(op.length), WsEntry(op.length, kb))
    ln = f.length(op.length)
    step: dict[str, object] = {"kind": "topk" if isinstance(op, ir.TopK) else "sort",
                               "keys": len(f.ws) - 1, "kbits": 8 * kb,
                               "length": op.length, "out": _target_spec(sp.home, f)}  # fmt: skip
    loop = [
        f"for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < {ln}; "
        "j += (int64_t)gridDim.x * blockDim.x) {"
    ]
    loop += [f"  {x}" for x in body.lines]
    if isinstance(op, ir.TopK):
        loop.append(f"  {keys}[j] = ~hp_okey_{kdt.name}({res});")  # descending
        step["k"] = op.k
    else:
        vals = f.scratch(mtype(op.dtype), ln, WsEntry(op.length, op.dtype.nbytes))
        step["vals"] = len(f.ws) - 1
        step["dtype"] = op.dtype.name
        loop.append(f"  const {ctype(op.dtype)} v = {res};")
        loop.append(f"  {keys}[j] = hp_okey_{kdt.name}(v);")
        loop.append(f"  {vals}[j] = v;")
    loop.append("}")
    f.piece("sort/topk keys", body.hoist + loop)
    if isinstance(op, ir.TopK):
        cnt = f"({f.length(op.k)} < {ln} ? {f.length(op.k)} : {ln})"
        f.piece("topk count", [f.store_scalar(op.count, cnt)], {op.count}, grid=False)
    f.host_step(str(step["kind"]), step)


def _scatter(f: CudaRenderer, sp: Special) -> None:
    add_op, lv, home = _start(f, sp, ScatterAdd)
    op = add_op.op
    idx_a = f.plan.arrays[op.idx]
    j = ir.Ref("__j", I64)
    at_idx = ir.Load(op.idx, j, idx_a.dtype)

    def idx_at(var: str, body: Body) -> str:
        return f.em.load(at_idx, body, {"__j": var})

    body = Body(level=lv, index="j", loop_len=idx_a.length)
    index = idx_at("j", body)
    val = f.em.load(ir.Load(op.vals, j, op.dtype), body, {"__j": "j"})
    cur = Body(level=lv, index="j", loop_len=idx_a.length)
    prev = Body(level=lv, index="j", loop_len=idx_a.length)
    ends = Body(level=lv)
    c_cur, c_prev = idx_at("j", cur), idx_at("jm", prev)
    first, last = idx_at("j0", ends), idx_at("jl", ends)
    cb = Body(level=lv)
    count = f.em.expr(op.count, cb, {})
    dt = op.dtype
    add = scatter_combine(op.mode, dt)
    counts = f.scratch("int64_t", "0", WsEntry(0, 8, 1))
    ok_name = f.names.fresh("__scatter_ok")
    slot = f.slot(ok_name, BOOL)
    tpl = f.env.get_template("cuda_scatter.cu.j2")
    kw = {"out_name": op.name, "length": f.length(op.length), "count": count,
          "idx_len": f.length(idx_a.length), "out": home, "vt": mtype(dt),
          "body": body.lines, "index": index, "value": val, "add": add, "counts": counts, "mode": op.mode,
          "cur_body": cur.lines, "prev_body": prev.lines, "cur": c_cur, "prev": c_prev,
          "ends_body": ends.lines, "first": first, "last": last, "slot": slot,
          "ok": f.names.get(ok_name)}  # fmt: skip
    hoist = cb.lines + body.hoist + cur.hoist + prev.hoist
    f.piece("scatter: descents", hoist + tpl.render(phase=0, **kw).splitlines())
    f.piece("scatter: parallel?", cb.lines + ends.hoist + tpl.render(phase=1, **kw).splitlines(),
                {ok_name}, grid=False)  # fmt: skip
    f.piece(f"scatter-{op.mode} into {op.name}", hoist + tpl.render(phase=2, **kw).splitlines())


def _scan_lines(f: CudaRenderer, op: ir.Scan, lv: int, home: str) -> list[str]:
    body = Body(level=lv, index="j", loop_len=op.length)
    res = f.em.apply(op.fn, ["j"], body)
    dt = op.dtype
    ln = f.length(op.length)
    if op.op == ops.REDUCE_SUM.name and dt.is_float:
        acc, init, upd, out = "double", "0.0", f"acc += (double)({res});", f"({ctype(dt)})acc"
    elif op.op == ops.REDUCE_SUM.name:
        acc, init, upd, out = ctype(dt), "0", f"acc = hp_add_{dt.name}(acc, {res});", "acc"
    else:
        acc, init, upd, out = (
            ctype(dt),
            minmax_identity(op.op, dt),
            f"acc = hp_{op.op}_{dt.name}(acc, {res});",
            "acc",
        )
    lines = [f"{acc} acc = {init};", f"for (int64_t j = 0; j < {ln}; j++) {{"]
    lines += [f"  {x}" for x in body.lines] + [f"  {upd}", f"  {home}[j] = {out};", "}"]
    return body.hoist + lines


def _segreduce(f: CudaRenderer, sp: Special) -> None:
    op, lv, home = _start(f, sp, ir.SegReduce)
    tiled = matmul.render(f, op, lv, home)
    if tiled is not None:
        f.piece(f"matmul{'_at' if op.matmul and op.matmul.at else ''} (tiled)", tiled)
        return
    body = Body(level=lv, index="j", loop_len=op.length)
    res = f.em.apply(op.fn, ["j"], body)
    red = reduction(op.op, res, op.fn.result.dtype, op.dtype, "(j1 - j0)", f.names)
    accs = [{"ctype": a.ctype, "name": a.name, "init": a.init,
             "combine": combine_acc(a, "sh[threadIdx.x]", "sh[threadIdx.x + s]")}
            for a in red.accs]  # fmt: skip
    code = f.env.get_template("cuda_segreduce.cu.j2").render(
        length=f.length(op.length), seg=f.length(op.seg),
        out_len=f.length(f.plan.arrays[op.name].length), accs=accs, body=body.lines,
        update=list(red.update), final=red.final, out=home,
    )  # fmt: skip
    f.piece(f"segreduce {op.op}", body.hoist + code.splitlines())


def _scan(f: CudaRenderer, sp: Special) -> None:
    op, lv, home = _start(f, sp, ir.Scan)
    f.piece("scan", _scan_lines(f, op, lv, home), grid=False)


def _custom(f: CudaRenderer, sp: Special) -> None:
    """A custom reduction: the C target's tree, run by one thread."""
    op, lv, _ = _start(f, sp, ir.Reduce)
    f.hoisted = []
    code = f.custom_reduce(op, lv, 0).splitlines()
    var = f.names.get(op.name)
    code = [ln for ln in code if ln.strip() != f"{ctype(op.dtype)} {var};"]
    code = [f"{ctype(op.dtype)} {var};", *f.hoisted, *code, f.store_scalar(op.name, var)]
    code = [ln for ln in code if not ln.lstrip().startswith("#pragma omp")]
    f.piece("custom reduce", code, {op.name}, grid=False)


def _target_spec(t: Destination | None, f: CudaRenderer) -> dict[str, object]:
    """Where a host step writes: a workspace index or a payload field."""
    assert t is not None
    if t.kind == "ws":
        return {"kind": "ws", "index": list(f.ws_ptr).index(t.name)}
    return {"kind": t.kind, "name": t.name}


STAGES: Mapping[type, StageRule] = MappingProxyType({
    ir.Filter: _filter,
    ir.TopK: _select,
    ir.Sort: _select,
    ir.SegReduce: _segreduce,
    ScatterAdd: _scatter,
    ir.Scan: _scan,
    ir.Reduce: _custom,
})  # fmt: skip
