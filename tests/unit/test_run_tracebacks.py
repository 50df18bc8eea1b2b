"""``bounded_traceback``: a failure's traceback as the attempt's error keeps it (issue 31)."""

from __future__ import annotations

from worker.run.tracebacks import MAX_CHARS, MAX_FRAMES, MAX_PART_CHARS, bounded_traceback

SECRET = "S3cretPw"


def raised(fn: object) -> BaseException:
    try:
        fn()  # type: ignore[operator]
    except BaseException as exc:
        return exc
    raise AssertionError("did not raise")


def test_a_chained_error_keeps_both_parts_and_a_long_message_keeps_the_frames() -> None:
    def inner() -> None:
        try:
            {}["k"]
        except KeyError as exc:
            raise ValueError(f"with {SECRET} " + "x" * 20_000) from exc

    text = bounded_traceback(raised(inner), [SECRET])
    assert "KeyError: 'k'\n\nThe above exception was the direct cause" in text
    assert ", in inner\n" in text
    assert f"ValueError: with *** {'x' * 100}" in text
    assert text.endswith(f"{'x' * 10}... ({20_000 + 22 - MAX_PART_CHARS} characters left out)\n")
    assert SECRET not in text
    assert len(text) < 3 * MAX_PART_CHARS


def test_deep_frames_are_cut_with_a_marker_and_the_whole_stays_bounded() -> None:
    def down(n: int) -> None:
        if n == 0:
            raise RuntimeError("bottom\x00")
        down(n - 1)

    text = bounded_traceback(raised(lambda: down(100)), [])
    # 101 frames of down, the lambda's and raised's: the innermost 20 kept.
    assert "  ... (83 outer frames left out)\n" in text
    assert text.count('  File "') <= MAX_FRAMES
    assert text.endswith("RuntimeError: bottom\\u0000\n")  # storable as jsonb
    assert len(text) <= MAX_CHARS


def test_a_traceback_over_the_limit_keeps_its_end_from_a_line_start() -> None:
    def chain(n: int) -> None:
        try:
            if n:
                chain(n - 1)
        finally:  # each error raised while handling the one below
            raise RuntimeError(f"level {n} " + "m" * (MAX_PART_CHARS - 100))

    text = bounded_traceback(raised(lambda: chain(12)), [])
    assert len(text) <= MAX_CHARS
    first, second, *_ = text.splitlines()
    assert first.startswith("... (the traceback's first ")
    assert first.endswith(" left out)")
    assert not second.startswith("m")  # the kept part starts at a line's start
    assert text.endswith("RuntimeError: level 12 " + "m" * (MAX_PART_CHARS - 100) + "\n")
