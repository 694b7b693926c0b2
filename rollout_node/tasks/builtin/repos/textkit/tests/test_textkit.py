from textkit import count_words, slugify, truncate, wrap


def test_truncate_short_text_unchanged():
    assert truncate("short", 10) == "short"


def test_slugify_simple():
    assert slugify("Hello World") == "hello-world"


def test_wrap_simple():
    assert wrap("the quick brown fox", 10) == ["the quick", "brown fox"]


def test_count_words_simple():
    assert count_words("one two three") == 3
