"""``rows_by_answer``: the table the warm-start measure and the probes print (P(each value | value asked))."""

from __future__ import annotations

import pytest

from train_node.infer.warm import format_rows, rows_by_answer


def test_each_row_is_the_mean_over_the_prefixes_that_ask_for_it() -> None:
    probs = [[0.9, 0.1, 0.0], [0.7, 0.3, 0.0], [0.2, 0.8, 0.0], [0.1, 0.1, 0.8]]
    rows = rows_by_answer(probs, [0, 0, 1, 2])
    for got, want in zip(rows, [[0.8, 0.2, 0.0], [0.2, 0.8, 0.0], [0.1, 0.1, 0.8]], strict=True):
        assert got == pytest.approx(want)
    assert format_rows(rows) == "[0.80,0.20,0.00] [0.20,0.80,0.00] [0.10,0.10,0.80]"


def test_a_value_nobody_asks_for_is_a_row_of_zeros_not_a_division_by_zero() -> None:
    assert rows_by_answer([[0.5, 0.5]], [1]) == [[0.0, 0.0], [0.5, 0.5]]
