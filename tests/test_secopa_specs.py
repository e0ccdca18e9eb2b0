"""Built-in model specs, ``file.py:NAME`` / ``module:NAME`` references, and modules built from
specs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from hipress.secopa.model.specs import (
    ModelSpecError,
    builtin_models,
    module_from_spec,
    resolve_model,
    spec_of_module,
)


def make_net() -> nn.Module:
    """A factory ``resolve_model`` imports as ``test_secopa_specs:make_net``."""
    return nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2, bias=False))


NOT_A_MODULE = 42


@pytest.mark.parametrize(
    ("name", "tensors", "numel"),
    [
        ("resnet50", 161, 25_557_032),  # torchvision's counts
        ("vgg19", 38, 143_667_240),
        ("bert-base", 199, 109_482_240),
        ("lstm-lm", 11, 119_243_600),
        ("mlp", 8, 4_462_346),
    ],
)
def test_builtin_specs_match_the_real_models(name: str, tensors: int, numel: int) -> None:
    spec = resolve_model(name)
    assert len(spec.params) == tensors and spec.numel == numel
    assert len({n for n, _ in spec.params}) == tensors  # unique names


def test_builtin_names_are_listed() -> None:
    assert builtin_models() == ["bert-base", "lstm-lm", "mlp", "resnet50", "vgg19"]


def test_module_attr_import_of_a_factory_and_a_class() -> None:
    spec = resolve_model("test_secopa_specs:make_net")
    assert spec.named_numels() == [("0.weight", 32), ("0.bias", 4), ("2.weight", 8)]
    assert resolve_model("torch.nn:Identity").params == ()


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("resnet51", "unknown model 'resnet51': use one of"),
        ("no_such_module_xyz:f", "cannot import 'no_such_module_xyz'"),
        ("torch.nn:NoSuchThing", "has no attribute 'NoSuchThing'"),
        ("torch.nn:Linear", "calling it without arguments failed"),
        ("test_secopa_specs:NOT_A_MODULE", "not an nn.Module or factory"),
        (":x", "expected module:attr"),
    ],
)
def test_bad_model_references_say_what_is_wrong(ref: str, message: str) -> None:
    with pytest.raises(ModelSpecError, match=message):
        resolve_model(ref)


def test_module_from_spec_has_the_same_parameters_and_gradients() -> None:
    spec = resolve_model("mlp")
    module = module_from_spec(spec)
    assert spec_of_module("mlp", module).params == spec.params
    module(torch.ones(3)).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters())


MODEL_FILE = """
from torch import nn


class Net(nn.Module):
    def __init__(self, width: int = 6) -> None:
        super().__init__()
        self.fc = nn.Linear(3, width)


class Wide(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(3, width)


def make_wide() -> nn.Module:
    return Wide(10)
"""


def test_a_file_path_or_a_module_from_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "train.py").write_text(MODEL_FILE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    want = [("fc.weight", 18), ("fc.bias", 6)]
    assert resolve_model("train.py:Net").named_numels() == want
    assert resolve_model("./train.py:Net").named_numels() == want
    assert resolve_model(f"{tmp_path}/train.py:make_wide").named_numels()[1] == ("fc.bias", 10)
    assert resolve_model("train:Net").named_numels() == want  # a module, from the cwd
    assert str(tmp_path) not in sys.path and "" not in sys.path  # left as it was


DATACLASS_FILE = """
from __future__ import annotations
from dataclasses import dataclass
from torch import nn

@dataclass
class Config:
    width: int = 4

def make_model(width: int = 4) -> nn.Module:
    return nn.Linear(Config(width).width, 2)
"""


def test_a_file_with_a_dataclass(tmp_path: Path) -> None:
    """A file is run as an imported module is, registered in ``sys.modules`` while it runs
    (``@dataclass`` looks its module up there; before, planning such a file failed with
    "'NoneType' object has no attribute '__dict__'")."""
    (tmp_path / "cfg_train.py").write_text(DATACLASS_FILE)
    spec = resolve_model(f"{tmp_path}/cfg_train.py:make_model(width=3)")
    assert spec.named_numels() == [("weight", 6), ("bias", 2)]


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("train.py:Wide", r"calling it without arguments failed .*make_model\(vocab=8192"),
        ("missing.py:Net", "no such file"),
        ("broken.py:Net", "running 'broken.py' failed: ZeroDivisionError"),
        ("train.py:Nope", "has no attribute 'Nope'"),
    ],
)
def test_file_references_say_what_a_factory_must_look_like(
    ref: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "train.py").write_text(MODEL_FILE)
    (tmp_path / "broken.py").write_text("1 / 0\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelSpecError, match=message):
        resolve_model(ref)


def test_the_console_script_plans_a_model_from_a_file(tmp_path: Path) -> None:
    # the installed `hipress` script, whose sys.path lacks the current directory
    (tmp_path / "train.py").write_text(MODEL_FILE)
    script = Path(sys.executable).with_name("hipress")
    for ref in ("train.py:Net", "./train.py:Net", "train:make_wide"):
        r = subprocess.run(
            [str(script), "plan", "--model", ref, "--workers", "4", "--bandwidth", "1gbit",
             "--budget", "0.1", "--threads", "1", "--json"],
            cwd=tmp_path, capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert '"fc.weight"' in r.stdout


SCRIPT_FILE = """
import argparse
import sys

from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
ARGS = parser.parse_args()  # at module level, as many training scripts do
SEEN_ARGV = list(sys.argv)


def make_model(vocab: int = 100, dim: int = 16, tied: bool = False) -> nn.Module:
    return nn.Sequential(nn.Embedding(vocab, dim), nn.Linear(dim, 2 if tied else vocab))


if __name__ == "__main__":
    raise SystemExit("the training ran")
"""


def test_a_training_script_is_imported_without_its_main_block_or_our_argv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "script.py").write_text(SCRIPT_FILE)
    (tmp_path / "strict.py").write_text(SCRIPT_FILE.replace('"--epochs"', '"epochs"'))
    monkeypatch.chdir(tmp_path)
    argv = ["hipress", "plan", "--model", "script.py:make_model", "--workers", "2"]
    monkeypatch.setattr(sys, "argv", argv)
    spec = resolve_model("script.py:make_model")  # plan's options would make its parser exit
    assert spec.named_numels() == [("0.weight", 1600), ("1.weight", 1600), ("1.bias", 100)]
    assert sys.argv == argv  # given back
    got = resolve_model("script.py:make_model(8192, tied=True, dim=4)").named_numels()
    assert got == [("0.weight", 32768), ("1.weight", 8), ("1.bias", 2)]
    assert resolve_model("script:make_model(vocab=10)").named_numels()[0] == ("0.weight", 160)
    with pytest.raises(
        ModelSpecError, match=r"importing 'strict.py' exited \(status 2\).*__main__"
    ):
        resolve_model("strict.py:make_model")
    assert sys.argv == argv


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("script.py:make_model(width=3)", r"calling it with \(width=3\) failed .*unexpected"),
        ("script.py:make_model(vocab=n)", "argument 'n' is not a literal"),
        ("script.py:make_model(vocab=1, vocab=2)", "'vocab' given twice"),
        ("script.py:make_model(**{'vocab': 2})", r"\*\* is not taken"),
        ("script.py:make_model(vocab=1", "expected module:attr"),
        ("script.py:make_model(vocab=-1)", r"make_model\(vocab=-1\) raised RuntimeError"),
        ("torch.nn:Linear(3, 4)", None),
        ("test_secopa_specs:NOT_A_MODULE()", "int, not a class or factory to call"),
    ],
)
def test_factory_arguments_are_literals_checked_before_the_call(
    ref: str, message: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hipress.secopa.model.specs import check_ref, parse_ref

    (tmp_path / "script.py").write_text(SCRIPT_FILE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["hipress"])
    if message is None:
        assert resolve_model(ref).named_numels() == [("weight", 12), ("bias", 4)]
        assert parse_ref(ref).args == (3, 4) and parse_ref(ref).called
        return
    with pytest.raises(ModelSpecError, match=message):
        resolve_model(ref)
    if ref.startswith("script.py") and "raised" not in message and "calling" not in message:
        with pytest.raises(ModelSpecError, match=message):
            check_ref(ref)  # found without importing anything
