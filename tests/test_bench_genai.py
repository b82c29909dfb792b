"""``bench/bench_genai.py``'s load-order cancelling ratio (no genai run: figures given)."""

from __future__ import annotations

import math

import pytest

from bench import bench_genai as bg


def _process(first: str, irkit: list[float], builder: list[float]) -> bg.LoadOrder:
    return bg.LoadOrder(
        first,
        {"irkit": bg.Figures(per_token=irkit), "builder": bg.Figures(per_token=builder)},
    )


def test_the_first_loaded_models_handicap_cancels():
    # irkit 1.02× the builder; whichever model a process loads first decodes 1.15× slower
    true, handicap = 1.02, 1.15
    orders = [
        _process("irkit", [true * handicap * 10.0] * 3, [10.0] * 3),
        _process("builder", [true * 10.0] * 3, [handicap * 10.0] * 3),
        _process("irkit", [true * handicap * 12.0] * 3, [12.0] * 3),
    ]
    first_irkit, first_builder, mean = bg.balanced_ratio(orders, "per_token")
    assert first_irkit == pytest.approx(true * handicap)
    assert first_builder == pytest.approx(true / handicap)
    assert mean == pytest.approx(true)
    assert mean == pytest.approx(math.sqrt(first_irkit * first_builder))


def test_one_order_only_gives_no_ratio():
    orders = [_process("irkit", [1.0], [1.0]), _process("irkit", [2.0], [1.0])]
    assert bg.balanced_ratio(orders, "per_token") is None


def test_the_report_prints_the_cancelled_ratio():
    figures = {
        "irkit": bg.Figures(per_token=[1.0, 1.0]),
        "builder": bg.Figures(per_token=[1.0, 1.0]),
    }
    orders = [_process("irkit", [1.1], [1.0]), _process("builder", [1.0], [1.1])]
    text = bg.report(figures, "x", 2, 1, orders=orders)
    assert (
        "per token, load order cancelled: 1.000 (irkit loaded first 1.100, builder first 0.909"
        in text
    )
    assert "prefill, load order cancelled" not in text  # (no prefill figures)
