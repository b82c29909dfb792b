"""``bench/bench_genai.py``'s load-order cancelling ratio and ``bench/bench_genai_alone.py``'s
table (no genai run: figures given)."""

from __future__ import annotations

import math

import pytest

from bench import bench_genai as bg
from bench import bench_genai_alone as alone


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


def test_one_model_per_process_ratios_are_of_the_process_medians():
    medians = {
        ("irkit", "default"): {"prefill": [0.10, 0.11, 0.50], "per_token": [0.016, 0.016, 0.02]},
        ("builder", "default"): {"prefill": [0.10, 0.10, 0.10], "per_token": [0.016, 0.017, 0.017]},
        ("irkit", "hugepages"): {"prefill": [0.12, 0.12, 0.12], "per_token": [0.014, 0.014, 0.014]},
        ("builder", "hugepages"): {"prefill": [0.1, 0.1, 0.1], "per_token": [0.016, 0.016, 0.016]},
    }
    text = alone.summary(medians, ["irkit", "builder"], ["default", "hugepages"], 3, 2)
    lines = text.splitlines()
    assert lines[0].startswith("one model per process, 3 processes per folder and environment x 2")
    assert "[default] prefill   ratio irkit/builder: 1.100" in lines  # (0.11 / 0.10: medians)
    assert "[default] per token ratio irkit/builder: 0.941" in lines  # (16 / 17)
    assert "[hugepages] per token ratio irkit/builder: 0.875" in lines
    assert "irkit: per token hugepages/default 0.875" in lines
    assert "builder: per token hugepages/default 0.941" in lines
    assert "[default] per token irkit   16.000 ms [16.000..20.000]" in text
