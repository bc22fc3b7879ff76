"""storyrewrite.markdown: the one table writer."""
import pytest

from storyrewrite.markdown import table


def test_a_table_is_a_header_a_rule_and_one_line_per_row_with_cells_as_given():
    assert table(["a", "b"], [[1, "x y"], ["2.50", None]]) == "| a | b |\n|---|---|\n| 1 | x y |\n| 2.50 | None |"
    assert table(["only"], []) == "| only |\n|---|"


def test_a_row_of_another_width_is_refused():
    with pytest.raises(ValueError, match=r"a row of 1 cells under a header of 2: \['x'\]"):
        table(["a", "b"], [["x"]])
