"""The NeurIPS version's compute at equal score: log-interpolation along the Best-of-N curve."""

import math

import pytest

from sbon.metrics import compute_at_score, normalized_score

CURVE = ([1, 2, 4, 8], [100.0, 110.0, 115.0, 118.0])  # relative compute, score of Best-of-B, 2B, 4B, 8B


def test_a_curve_point_reads_back_its_own_compute():
    assert len(CURVE[0]) == len(CURVE[1]) > 1
    for x, y in zip(*CURVE):
        assert compute_at_score(*CURVE, y) == (pytest.approx(x), False)


def test_between_points_interpolates_in_log_compute():
    x, extrapolated = compute_at_score(*CURVE, 105.0)  # halfway from 100 to 110: the geometric mean of 1 and 2
    assert x == pytest.approx(math.sqrt(2)) and not extrapolated
    assert compute_at_score(*CURVE, 116.0)[0] == pytest.approx(4 * 2 ** (1 / 3))


def test_outside_the_curve_extrapolates_and_says_so():
    above, flag = compute_at_score(*CURVE, 121.0)  # one more step of 3 points: twice the compute
    assert above == pytest.approx(16) and flag
    below, flag = compute_at_score(*CURVE, 90.0)
    assert below == pytest.approx(0.5) and flag


def test_flat_stretch_takes_the_cheaper_end():
    assert compute_at_score([1, 2, 4], [100.0, 100.0, 104.0], 100.0) == (pytest.approx(1), False)


def test_score_against_best_of_b_is_the_official_improvement():
    # official plot_compare.py: 100 * (1 + (best - max_B) / (max_B - min_B))
    baseline = [1.0, 3.0, 2.0]
    assert normalized_score(baseline, 3.0) == 100 and normalized_score(baseline, 4.0) == pytest.approx(150)
