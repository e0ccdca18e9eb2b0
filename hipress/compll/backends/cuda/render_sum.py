"""The CUDA target's two extra entry points (see :mod:`hipress.compll.backends.cuda.render`):
``hp_decode_sum`` for a decode that is one map over its output, and the workspace-free
``hp_sparse_*`` kernels for a sparse decode (:mod:`hipress.compll.lower.sparse`)."""

from __future__ import annotations

import jinja2

from hipress.compll.backends.cfamily.body import Body
from hipress.compll.backends.cfamily.family import CFamily, tileable
from hipress.compll.backends.cfamily.syntax import ctype
from hipress.compll.backends.cuda.abi import SUM_PAYLOADS
from hipress.compll.ir import nodes as ir
from hipress.compll.lower.kernel_plan import KernelPlan
from hipress.compll.lower.sparse import SparseDecode


def decode_sum_kernel(env: jinja2.Environment, prog: ir.Program, plan: KernelPlan) -> str | None:
    """``hp_decode_sum`` for a decode that is one map over its output (see module doc)."""
    if not tileable(plan):
        return None
    f = CFamily(env, prog, plan, "hp_decode_sum", tile=True)
    f.inputs()
    f.arrays()
    (lp,) = [lp for st in plan.steps for lp in st.loops]
    (item,) = lp.items
    body = Body(level=lp.level, index="i", loop_len=lp.length, fuse=True)
    lets: list[str] = []
    for st in plan.steps:
        for let in st.lets:
            lb = Body(level=st.level)
            v = f.em.expr(let.value, lb, {})
            lets += (
                lb.hoist
                + lb.lines
                + [f"const {ctype(let.value.dtype)} {f.names.get(let.name)} = {v};"]
            )
    value = f.em.apply(item.op.fn, ["i"], body)
    return env.get_template("cuda_decode_sum.cu.j2").render(
        title=f"{prog.name}: hp_decode_sum", maxk=SUM_PAYLOADS, lengths=f.length_lines,
        length=f.length(lp.length), setup=f.setup + f.safe_lines + lets + body.hoist,
        body=body.lines, value=value,
    )  # fmt: skip


def sparse_kernels(
    env: jinja2.Environment, prog: ir.Program, plan: KernelPlan, sparse: SparseDecode | None
) -> str | None:
    """The ``hp_sparse_*`` kernels for a sparse decode ``sparse`` (of ``prog``, whose decode
    plan is ``plan``), unless the decode is one map over its output."""
    sd = None if tileable(plan) else sparse
    if sd is None:
        return None
    fields = CFamily(env, prog, plan, "hp_sparse_fields").sparse_fields(sd, "HP_FN")
    return env.get_template("cuda_sparse.cu.j2").render(algorithm=prog.name, fields=fields)


__all__ = ["decode_sum_kernel", "sparse_kernels"]
