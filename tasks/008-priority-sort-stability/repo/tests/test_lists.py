from todo.lists import TodoList


def test_priority_order():
    t = TodoList()
    t.add("low", 1)
    t.add("high", 9)
    t.add("mid", 5)
    assert [i.title for i in t.ordered()] == ["high", "mid", "low"]


def test_done_hidden():
    t = TodoList()
    t.add("a").done = True
    t.add("b")
    assert [i.title for i in t.ordered()] == ["b"]
