"""One program -> one C file: the functions of each plan (:class:`.render.CFunction`), the tile
functions ``hp_decode_sum`` runs where the decode is a plain map over the output, and the file's
prelude and ABI (``templates/c_file.c.j2``).

Where the decode is tabulated (:mod:`.lut`) in both its plain and its accumulating form, with
the same tables, ``hp_decode_sum`` also gets ``hp_decode_prep_tile``: it fills a tile's tables
and unpacked values into the caller's buffers, so that the payloads of a tile are looked up and
summed in one pass (``hp_tile_lut_sum``), each element's sum formed in a register in payload
order, and the output tile is written once instead of read and written once per payload.
"""

from __future__ import annotations

from hipress.compll.backends.c.block import TILE
from hipress.compll.backends.c.blockpack import pack_sections
from hipress.compll.backends.c.lut import LUT_ROWS
from hipress.compll.backends.c.render import MAXT, PAR_MIN, CFunction
from hipress.compll.backends.cfamily.family import CFamily, tileable
from hipress.compll.backends.cfamily.prelude import prelude
from hipress.compll.backends.render import ABI_VERSION, BANNER, environment
from hipress.compll.ir import nodes as ir
from hipress.compll.lower.lower import Lowered, lower_program


def render_program(prog: ir.Program, plans: Lowered) -> str:
    """C source of ``prog`` from its plans: ``hp_encode``, ``hp_decode``, ``hp_decode_acc``,
    ``hp_decode_sum`` and their workspace-size functions (see ``templates/c_file.c.j2`` for
    the ABI)."""
    env = environment()
    dec, acc = plans.decode, plans.decode_acc
    funcs = [
        CFunction(env, prog, pack_sections(prog, plans.encode), "hp_encode").render(),
        CFunction(env, prog, dec, "hp_decode").render(),
        CFunction(env, prog, acc, "hp_decode_acc").render(),
    ]
    tiled = tileable(dec) and tileable(acc)
    fused = False
    if tiled:
        funcs += [
            CFunction(env, prog, dec, "hp_decode_tile", tile=True).render(),
            CFunction(env, prog, acc, "hp_decode_acc_tile", tile=True).render(),
        ]
        # the first payload's tables are the plain decode's, the others' the accumulating
        # one's: one function serves both only where the two render the same
        first, other = (
            CFunction(env, prog, p, "hp_decode_prep_tile", tile=True).render_prep()
            for p in (dec, acc)
        )
        if first is not None and first == other:
            funcs.append(first)
            fused = True
    sd = None if tiled else plans.sparse
    if sd is not None:
        funcs.append(CFamily(env, prog, dec, "hp_sparse_fields").sparse_fields(sd))
    decode_sum = env.get_template("c_decode_sum.c.j2").render(
        algorithm=prog.name, tiled=tiled, sparse=sd is not None, fused=fused, rows=LUT_ROWS
    )
    return env.get_template("c_file.c.j2").render(
        banner=BANNER, algorithm=prog.name, digest=prog.digest()[:16], target="c",
        prelude=prelude(cuda=False, tile=TILE, maxt=MAXT, par_min=PAR_MIN), abi=ABI_VERSION,
        functions=funcs, decode_sum=decode_sum,
    )  # fmt: skip


def lower(prog: ir.Program) -> Lowered:
    """The plans the C target renders ``prog`` from (loops fused)."""
    return lower_program(prog, unfused=False)


def render_c(prog: ir.Program) -> str:
    """C source of ``prog``, lowered here (see :func:`render_program`); equal programs give
    byte-identical text."""
    return render_program(prog, lower(prog))


__all__ = ["lower", "render_c", "render_program"]
