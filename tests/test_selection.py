"""Which tensors may carry a lossy codec (:class:`hipress.core.rule.Selection`): name patterns,
the shape rule, embeddings and 1-D tensors kept plain by the default rule and by SeCoPa, the
warning for a lossy codec on an embedding; on real gloo groups through the DDP hook."""

from __future__ import annotations

import logging

import pytest
import torch
from dist_utils import run_workers
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from hipress.casync import register
from hipress.codec.errors import CaSyncError
from hipress.codec.planning import keep_plain, resolve_plan
from hipress.core.plan import Plan, Strategy, TensorPlan
from hipress.core.rule import Selection, embedding_names


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(300, 256)  # 76,800 elements: over the default rule's size
        self.proj = nn.Linear(256, 300)
        self.out = nn.Linear(300, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.proj(self.tok(x)))).square().mean()


def test_patterns_shapes_and_defaults() -> None:
    sel = Selection(exclude="out.*", embeddings=frozenset({"tok.weight"}))
    assert sel.reason("out.weight", (256, 300)) == "excluded by 'out.*'"
    assert sel.reason("tok.weight", (300, 256)) == "embedding"
    assert sel.reason("proj.bias", (300,)) == "1-D"
    assert sel.reason("proj.weight", (300, 256)) is None
    assert Selection(include=["tok.*"]).reason("tok.weight", (300, 256)) is None
    # exclude wins over include; the shape rule; only what was asked for an explicit plan
    assert Selection(include="*", exclude="tok.*").reason("tok.weight", (3, 2)) is not None
    conv = Selection(shapes="matrices")
    assert conv.reason("c.weight", (8, 3, 3, 3)) == "shape [8, 3, 3, 3] rejected by shapes='matrices'"
    assert Selection().reason("tok.weight", (300, 256), implicit=False) is None
    wide = Selection(shapes=lambda name, shape: shape[0] > 100)
    assert wide.reason("a.weight", (50, 500)) is not None and wide.reason("b.w", (500, 5)) is None


def test_embeddings_by_module_type_or_by_name() -> None:
    assert embedding_names(Net()) == {"tok.weight"}
    tied = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=False))
    tied[1].weight = tied[0].weight  # one tensor: named under its first name
    assert embedding_names(tied) == {"0.weight"}
    by_name = Selection()  # no model: wte/wpe and *emb*.weight, 2-D
    assert by_name.is_embedding("transformer.wte.weight", (50, 8))
    assert by_name.is_embedding("model.embed_tokens.weight", None)
    assert not by_name.is_embedding("embed.bias", (8,))
    assert not by_name.is_embedding("h.0.attn.weight", (8, 8))


@pytest.mark.parametrize(
    "kwargs",
    [{"include": 3}, {"exclude": [""]}, {"shapes": "vectors"}],
)
def test_bad_arguments_are_named(kwargs: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        Selection(**kwargs)


def test_keep_plain_records_reasons_and_predictions() -> None:
    e = TensorPlan("a", 100, True, Strategy.ALLGATHER, 1, predicted_ms=1.0, uncompressed_ms=3.0)
    plan = Plan("onebit", {}, 2, (e,), totals={"planned": 1.0, "all_uncompressed": 3.0})
    kept = keep_plain(plan, {"a": "embedding"})
    assert not kept.entries[0].compress and kept.entries[0].predicted_ms == 3.0
    assert kept.meta["kept_plain"] == {"a": "embedding"}
    # the step's prediction was the compressed plan's: dropped, the baseline kept
    assert kept.totals == {"all_uncompressed": 3.0}


def test_explicit_plan_on_an_embedding_warns(caplog: pytest.LogCaptureFixture) -> None:
    from hipress.codec.algorithm import resolve_algorithm

    alg = resolve_algorithm("onebit", None, "reference")
    numels = [("tok.weight", 76800), ("proj.weight", 76800)]
    plan = Plan("onebit", {}, 2, tuple(
        TensorPlan(n, k, True, Strategy.ALLGATHER) for n, k in numels))  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="hipress.codec.planning"):
        got = resolve_plan(plan, alg, numels, 2, selection=Selection(exclude="proj.*", embeddings={"tok.weight"}))
    assert [e.compress for e in got.entries] == [True, False]  # exclude= applies to it too
    assert sum("embedding weight tok.weight" in r.getMessage() for r in caplog.records) == 1


def test_patterns_that_match_nothing_are_refused() -> None:
    names = ["tok.weight", "proj.weight", "proj.bias"]
    Selection(include="tok.*", exclude=["proj.bias"]).check_names(names)
    with pytest.raises(ValueError, match=r"exclude='proj\.wieght' .* did you mean 'proj\.weight'"):
        Selection(include="tok.*", exclude="proj.wieght").check_names(names)
    with pytest.raises(ValueError, match=r"include='head\.\*' matches no parameter"):
        Selection(include=["tok.*", "head.*"]).check_names(names)


def test_register_rejects_a_bad_pattern_by_name() -> None:
    with pytest.raises(CaSyncError, match="exclude"):
        from hipress.casync.hook import selection_for

        selection_for(Net(), None, 5, "all")  # type: ignore[arg-type]


def _plans(rank: int, world_size: int) -> dict:
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logging.getLogger("hipress.codec.planning").addHandler(Keep(logging.WARNING))
    out = {}
    for key, kwargs in {
        "default": {},
        "include": {"include": ["tok.*"]},
        "exclude": {"exclude": "proj.weight"},
        "matrices": {"shapes": "matrices", "include": "*.bias"},
        "auto": {"plan": "auto"},
    }.items():
        torch.manual_seed(0)
        plan = register(DDP(Net()), "onebit", **kwargs).plan  # ("auto": every rank reads it)
        out[key] = ({e.name: e.compress for e in plan.entries},
                    dict(plan.meta.get("kept_plain", {})))  # fmt: skip
    for key, kwargs in {"typo": {"include": "tok.wieght"}, "none": {"exclude": "*.norm*"}}.items():
        try:
            register(DDP(Net()), "onebit", **kwargs)
        except CaSyncError as exc:
            out[key] = str(exc)
    out["warnings"] = [r for r in records if "embedding weight" in r]
    return out


def test_selection_through_register_on_two_ranks() -> None:
    for got in run_workers(_plans, 2):
        plain, kept = got["default"]
        assert plain == {"tok.weight": False, "proj.weight": True, "proj.bias": False,
                         "out.weight": True, "out.bias": False}  # fmt: skip
        assert kept["tok.weight"] == "embedding" and kept["out.bias"] == "1-D"
        assert got["include"][0]["tok.weight"]
        assert not got["exclude"][0]["proj.weight"] and got["exclude"][0]["out.weight"]
        assert got["exclude"][1]["proj.weight"] == "excluded by 'proj.weight'"
        assert got["matrices"][0]["tok.weight"] is False  # embeddings stay plain
        assert not got["auto"][0]["tok.weight"]
        assert got["auto"][1]["tok.weight"] == "embedding"
        # the one plan that puts onebit on the embedding warns, once on each rank
        assert len(got["warnings"]) == 1
        # a pattern that matches no parameter is refused, with the names it may have meant
        assert "include='tok.wieght' matches no parameter" in got["typo"]
        assert "did you mean 'tok.weight'" in got["typo"]
        assert "exclude='*.norm*' matches no parameter" in got["none"] and "some: " in got["none"]


def test_hipress_plan_prints_what_it_kept_plain(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from hipress.cli import main
    from hipress.secopa.model.profile import affine_profile

    profile = tmp_path / "profile.json"
    affine_profile("onebit", encode=(1e-6, 0.01, 0.0), decode=(1e-6, 0.01, 0.0),
                   merge=(5e-7, 0.01, 0.0), bytes_per_element=1 / 8).save(profile)  # fmt: skip
    model = tmp_path / "net.py"
    model.write_text(
        "from torch import nn\n"
        "class Net(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.tok = nn.Embedding(4096, 256)\n"
        "        self.proj = nn.Linear(256, 4096)\n"
    )
    base = ["plan", "--model", f"{model}:Net", "--workers", "2", "--profile", str(profile),
            "--bandwidth", "100mbit"]  # fmt: skip
    assert main([*base, "--out", str(tmp_path / "p.json")]) == 0
    out = capsys.readouterr().out
    assert "  embedding: tok.weight" in out and "  1-D: proj.bias" in out
    plan = Plan.load(tmp_path / "p.json")
    assert [e.compress for e in plan.entries] == [False, True, False]
    assert main([*base, "--include", "tok.*", "--exclude", "proj.weight", "--json"]) == 0
    plan = Plan.from_json(capsys.readouterr().out)
    assert [e.compress for e in plan.entries] == [True, False, False]
    assert plan.meta["kept_plain"]["proj.weight"] == "excluded by 'proj.weight'"
    assert main([*base, "--exclude", ""]) == 2
    assert "--exclude" in capsys.readouterr().err
    assert main([*base, "--include", "tok.wieght"]) == 2  # names no parameter of the model
    err = capsys.readouterr().err
    assert "--include 'tok.wieght' matches no parameter" in err and "'tok.weight'" in err
    assert main([*base, "--algorithm", "powersgd", "--exclude", "proj.wieght"]) == 2  # (rounds)
    assert "--exclude 'proj.wieght' matches no parameter" in capsys.readouterr().err
