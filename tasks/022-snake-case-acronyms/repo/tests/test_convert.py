from casing.convert import to_snake, to_camel


def test_camel():
    assert to_snake("userId") == "user_id"


def test_pascal():
    assert to_snake("OrderItem") == "order_item"


def test_to_camel():
    assert to_camel("order_item_id") == "orderItemId"
