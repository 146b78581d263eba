import pytest

from mydecide.errors import UserError
from mydecide.formats import check_format, stamped, unstamped


def test_a_stamped_file_reads_back_and_unstamps():
    data = stamped({"a": 1, "format": 9}, 2)
    assert list(data) == ["format", "a"] and data["format"] == 2
    check_format(data, "x.json", version=2, remedy="retrain")
    assert unstamped(data) == {"a": 1}


@pytest.mark.parametrize(
    ("data", "saved"),
    [
        ({"a": 1}, "no format stamp"),
        ({"format": 0}, "format 0"),
        ({"format": "1"}, "format '1'"),
        ([1], "no format stamp"),
    ],
)
def test_another_format_is_refused_in_one_line_naming_the_file_and_the_remedy(data, saved):
    with pytest.raises(UserError) as err:
        check_format(data, "run/adapter/mydecide_render.json", version=1, remedy="retrain the adapter")
    assert str(err.value) == (
        f"run/adapter/mydecide_render.json: saved by another version of mydecide ({saved}; this version reads "
        "format 1); retrain the adapter"
    )


def test_true_is_not_format_1():
    with pytest.raises(UserError):
        check_format({"format": True}, "f", version=1, remedy="r")
