import pytest
from gradebook.grades import letter


def test_inside_bands():
    assert [letter(s) for s in (95, 85, 75, 65, 10)] == list("ABCDF")


def test_range():
    with pytest.raises(ValueError):
        letter(101)
