"""Reading the training curves DVCLive writes (storyrewrite.curves)."""
import pytest

from storyrewrite.curves import parse_curve
from storyrewrite.io import InputError


def test_a_curve_drops_a_last_line_cut_short_and_names_a_bad_line_before_it():
    """A kill during DVCLive's write leaves a last line without its newline: it is dropped. A
    malformed line before the last is an error naming the file's line."""
    assert parse_curve("step\tloss\n1\t2.5\n2\t2.25\n", "loss", "f.tsv") == [{"step": 1, "value": 2.5}, {"step": 2, "value": 2.25}]
    assert parse_curve("step\tloss\n1\t2.5\n2\t2.2", "loss", "f.tsv") == [{"step": 1, "value": 2.5}]
    with pytest.raises(InputError, match=r"^f\.tsv:3: not a `step<TAB>loss` row$"):
        parse_curve("step\tloss\n1\t2.5\n2\tnan?\n3\t2.0\n", "loss", "f.tsv")
