from todo.lists import TodoList


def test_ties_keep_insertion_order():
    t = TodoList()
    t.add("write report", 2)
    t.add("email Ann", 2)
    t.add("fix bug", 5)
    assert [i.title for i in t.ordered()] == ["fix bug", "write report", "email Ann"]


def test_all_equal():
    t = TodoList()
    for name in "abcd":
        t.add(name)
    assert [i.title for i in t.ordered()] == list("abcd")


def test_top():
    t = TodoList()
    t.add("x", 1)
    t.add("y", 3)
    t.add("z", 3)
    assert [i.title for i in t.top(2)] == ["y", "z"]


def test_distinct_priorities():
    t = TodoList()
    t.add("a", 1)
    t.add("b", 2)
    assert [i.title for i in t.ordered()] == ["b", "a"]
