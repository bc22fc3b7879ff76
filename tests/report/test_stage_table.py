"""The stages table's numbers: counts and rates as a reader of a table reads them."""
from __future__ import annotations

import pytest

from storyrewrite.report.stages import rate


@pytest.mark.parametrize("value", [1.234e-7, 4.56e-5, 0.00123, 0.5, 7.0, 12.34, 468.2, 999.6, 1234.5, 19999.9, 2.52e6])
def test_a_rate_has_three_significant_digits_and_no_exponent(value):
    """Read back (separators dropped), a rate is within half a unit of its third significant
    digit of the value: at most 0.5 % off; no exponent at any of these sizes."""
    shown = rate(value)
    assert "e" not in shown
    assert abs(float(shown.replace(",", "")) - value) <= 0.005 * value


def test_a_large_rate_is_grouped_in_thousands():
    assert rate(2.52e6) == "2,520,000"
    assert rate(999.6) == "1,000"  # (.3g alone writes 1e+03)
    assert rate(2290.4) == "2,290"
    assert rate(468.2) == "468"


def test_a_small_rate_keeps_its_three_digits_after_the_zeros():
    assert rate(4.56e-5) == "0.0000456"  # (.3g alone writes 4.56e-05)
    assert rate(0.5) == "0.5" and rate(7.0) == "7" and rate(12.34) == "12.3"
