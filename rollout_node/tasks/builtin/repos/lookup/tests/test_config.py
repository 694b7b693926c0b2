import lookup


def test_value_is_exported():
    assert isinstance(lookup.VALUE, str)
