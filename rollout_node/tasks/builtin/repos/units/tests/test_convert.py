import pytest
from units import convert


def test_metric():
    assert convert(1500, "m", "km") == pytest.approx(1.5)


def test_imperial():
    assert convert(1, "ft", "in") == pytest.approx(12)
    assert convert(1, "mi", "km") == pytest.approx(1.609344)
