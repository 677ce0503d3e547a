from textkit.slug import slugify, unique_slug


def test_accents_kept_as_base_letters():
    assert slugify("Crème Brûlée Recipe") == "creme-brulee-recipe"


def test_angstrom():
    assert slugify("Ångström") == "angstrom"


def test_ascii_unchanged():
    assert slugify("  Already -- fine  ") == "already-fine"


def test_unique_with_accents():
    assert unique_slug("Café", {"cafe"}) == "cafe-2"


def test_custom_sep():
    assert slugify("Über Cool", sep="_") == "uber_cool"
