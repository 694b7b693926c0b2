import pytest
from summary import AGGREGATES, apply


def test_known_aggregates():
    assert sorted(AGGREGATES) == ["first", "last", "max", "min"]


def test_apply_each_aggregate():
    values = [4, 7, 1, 5]
    assert [apply(name, values) for name in ("min", "max", "first", "last")] == [1, 7, 4, 5]


def test_apply_rejects_unknown_and_empty():
    with pytest.raises(ValueError, match="unknown aggregate"):
        apply("median", [1])
    with pytest.raises(ValueError, match="no values"):
        apply("max", [])
