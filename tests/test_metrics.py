import math

import pytest

from sbon.metrics import (best_of_m_size, correlations, normalized_score, oracle_cut, speedup, token_rate)


def test_speedup_and_token_rate():
    assert speedup(10.0, 2.0) == 5.0
    assert token_rate(250, 1000) == 0.25


def test_normalized_score_hand_computed():
    bon = [1.0, 2.0, 3.0, 5.0]
    assert normalized_score(bon, 5.0) == 100.0  # SBoN found BoN's best
    assert normalized_score(bon, 1.0) == 0.0  # ... or its worst
    assert normalized_score(bon, 4.0) == pytest.approx(75.0)  # 100 * (1 - (5-4)/(5-1))
    assert normalized_score([2.0, 2.0], 2.0) == 100.0


def test_best_of_m_size():
    assert best_of_m_size(100, 4.95) == 20  # round(20.2)
    assert best_of_m_size(32, 64.0) == 1  # never below one
    assert best_of_m_size(16, 0.5) == 16  # never above N


def test_correlations_hand_computed():
    c = correlations([1, 2, 3, 4], [2, 4, 6, 8])
    assert c["pearson"] == pytest.approx(1.0) and c["kendall"] == pytest.approx(1.0)
    # One discordant pair (3,4 swapped) out of 6: tau = (5 - 1) / 6
    assert correlations([1, 2, 3, 4], [1, 2, 4, 3])["kendall"] == pytest.approx(4 / 6)
    assert math.isnan(correlations([1.0], [2.0])["pearson"])


def test_oracle_cut():
    # The best final reward (4) has partial 0.5; two of four partials lie below it.
    assert oracle_cut([0.1, 0.5, 0.3, 0.9], [1, 4, 2, 3]) == 0.5
    assert oracle_cut([0.9, 0.1], [5, 1]) == 0.5
    assert oracle_cut([0.1, 0.9], [5, 1]) == 0.0
