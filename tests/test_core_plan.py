"""How a plan prints (hipress.core.plan): a table for people, the dataclass repr for code."""

from __future__ import annotations

from hipress.core.plan import Plan, Strategy, TensorPlan

PLANNED = Plan(
    "onebit",
    {},
    4,
    (
        TensorPlan("encoder.weight", 2_359_296, True, Strategy.PS, 2, 1.25, 3.5),
        TensorPlan("encoder.bias", 768, False, Strategy.ALLREDUCE, 1, 0.05, 0.05),
    ),
    totals={"planned": 1.3},
)


def test_a_plan_prints_as_a_table() -> None:
    assert str(PLANNED).splitlines() == [
        "plan for onebit, 4 workers: 1 of 2 tensors compressed",
        "parameter        elements  decision  strategy   K  pred ms  plain ms",
        "encoder.weight  2,359,296  compress  ps         2    1.250     3.500",
        "encoder.bias          768  plain     allreduce  1    0.050     0.050",
    ]
    assert PLANNED.table(heading=False).splitlines()[0].startswith("parameter")
    assert f"{PLANNED}" == PLANNED.table()


def test_a_plan_without_predictions_leaves_their_columns_out_and_repr_stays_whole() -> None:
    plain = Plan("terngrad", {"bitwidth": 2}, 2, (TensorPlan("w", 10, False, Strategy.ALLREDUCE),))
    assert str(plain).splitlines() == [
        "plan for terngrad {'bitwidth': 2}, 2 workers: 0 of 1 tensors compressed",
        "parameter  elements  decision  strategy   K",
        "w                10  plain     allreduce  1",
    ]
    assert repr(plain).startswith("Plan(algorithm='terngrad', params={'bitwidth': 2}")
    assert "TensorPlan(name='w'" in repr(plain)
