from units import Money


def test_parse_and_format():
    assert Money.parse("12.34") == Money(1234)
    assert Money.parse("7") == Money(700)
    assert Money(1234).format() == "12.34 EUR"


def test_add_same_currency():
    assert Money(150) + Money(275) == Money(425)


def test_split_even():
    assert Money(300).split(3) == [Money(100)] * 3
