import pytest
from intervals import Interval, merge


def test_length():
    assert len(Interval(2, 5)) == 3


def test_rejects_reversed():
    with pytest.raises(ValueError):
        Interval(5, 2)


def test_contains_inside():
    assert Interval(1, 5).contains(1)
    assert Interval(1, 5).contains(4)


def test_overlaps_overlapping():
    assert Interval(1, 5).overlaps(Interval(3, 8))
    assert not Interval(1, 2).overlaps(Interval(4, 5))


def test_intersection_overlapping():
    assert Interval(1, 5).intersection(Interval(3, 8)) == Interval(3, 5)


def test_merge_overlapping():
    assert merge([Interval(2, 5), Interval(1, 3), Interval(7, 8)]) == [Interval(1, 5), Interval(7, 8)]
