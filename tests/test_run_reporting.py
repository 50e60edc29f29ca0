"""What ``kvsim run`` tells a user: failure reasons grouped, a progress line on a terminal."""

from __future__ import annotations

import io

from kvsim.scenario.failures import failure_report, group_failures
from kvsim.scenario.run_progress import ProgressLine, format_duration, terminal_progress


def test_reasons_differing_only_in_numbers_form_one_group_with_ranges():
    reasons = [f"prompt of {n} tokens >= max_model_len 2048" for n in (5000, 9000, 7000)]
    reasons += ["cannot be scheduled even with the whole KV cache free"]
    assert group_failures(reasons) == [
        (3, "prompt of 5000..9000 tokens >= max_model_len 2048"),
        (1, "cannot be scheduled even with the whole KV cache free")]


def test_ranges_compare_numbers_not_text():
    assert group_failures(["needs 9 blocks", "needs 10 blocks"]) == [(2, "needs 9..10 blocks")]


def test_the_report_shows_the_most_frequent_groups_then_the_rest():
    reasons = [f"kind{k} failure" for k in range(7) for _ in range(7 - k)]
    lines = failure_report(reasons, num_requests=40, limit=2)
    # "kind0" .. "kind6" differ only in a number: one group.
    assert lines == ["28 of 40 requests failed:", "  28 x kind0..6 failure"]
    lines = failure_report(["a", "b", "b", "c"], num_requests=4, limit=2)
    assert lines == ["4 of 4 requests failed:", "  2 x b", "  1 x a",
                     "  1 x other reasons (see the fail_reason column of requests.csv)"]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_line_is_drawn_at_most_once_a_second():
    clock, out = FakeClock(), io.StringIO()
    line = ProgressLine(out, counting="arrived", clock=clock)
    line(0.5, 10, 100)                     # before the first second: nothing
    assert out.getvalue() == ""
    clock.now = 1.0
    line(12.0, 20, 100)
    clock.now = 1.5
    line(13.0, 30, 100)                    # half a second later: not redrawn
    assert out.getvalue() == "\rsimulated 12.0 s | 20 of 100 requests arrived | 20 req/s | ETA 4s"
    clock.now = 2.0
    line(14.0, 40, 100)
    last = "simulated 14.0 s | 40 of 100 requests arrived | 20 req/s | ETA 3s"
    assert out.getvalue().endswith("\r" + last)
    line.close()                           # erased, so the summary starts on a clean line
    assert out.getvalue().endswith("\r" + last + "\r" + " " * len(last) + "\r")


def test_a_shorter_line_blanks_the_end_of_the_longer_one():
    clock, out = FakeClock(), io.StringIO()
    line = ProgressLine(out, clock=clock, first_after_s=0.0)
    clock.now = 1.0
    line(None, 1_000_000, None)
    clock.now = 2.0
    line(None, 5, None)
    first = "1,000,000 requests done | 1,000,000 req/s"
    assert out.getvalue() == "\r" + first + "\r" + "5 requests done | 2 req/s".ljust(len(first))


def test_only_a_terminal_gets_a_progress_line():
    assert terminal_progress(stream=io.StringIO()) is None
    assert isinstance(terminal_progress(stream=FakeTerminal()), ProgressLine)


def test_durations_read_as_a_clock():
    assert [format_duration(s) for s in (42, 243, 7500, 273600)] == ["42s", "4m03s", "2h05m", "3d04h"]

