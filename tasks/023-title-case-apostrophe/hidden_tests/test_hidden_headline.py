from press.headline import headline


def test_contraction():
    assert headline("don't stop me now") == "Don't Stop Me Now"


def test_possessive():
    assert headline("the cat's pyjamas") == "The Cat's Pyjamas"


def test_shouting_lowered():
    assert headline("LORD OF THE RINGS") == "Lord of the Rings"


def test_extra_spaces():
    assert headline("  a  tale ") == "A Tale"
