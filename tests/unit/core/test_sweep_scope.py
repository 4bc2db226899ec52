"""SweepScope: a reconciler pass reads every state only for a new assignment, else the open and written ones."""

from __future__ import annotations

from streamproc.core.sweep_scope import SweepScope

FIRST = (1, frozenset({"p0", "p1"}))


def test_the_first_pass_and_a_new_assignment_read_everything() -> None:
    scope = SweepScope()
    assert scope.plan(FIRST) is None
    scope.done(FIRST, {b"open"})
    assert scope.plan((2, frozenset({"p0", "p1"}))) is None  # same partitions, a new generation
    assert scope.plan((1, frozenset({"p0"}))) is None


def test_later_passes_read_the_open_keys_and_those_written_since() -> None:
    scope = SweepScope()
    scope.plan(FIRST)
    scope.written(b"during-the-full-pass")
    scope.done(FIRST, {b"open"})
    scope.written(b"new")
    assert scope.plan(FIRST) == {b"open", b"new", b"during-the-full-pass"}
    scope.done(FIRST, set())  # all ended
    assert scope.plan(FIRST) == set()


def test_a_pass_that_did_not_complete_makes_the_next_one_read_everything() -> None:
    scope = SweepScope()
    scope.plan(FIRST)
    scope.done(FIRST, {b"open"})
    scope.plan(FIRST)
    scope.reset()
    assert scope.plan(FIRST) is None
