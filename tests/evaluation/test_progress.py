"""The progress line: arm i of N, unit s of S, elapsed, ETA over the plan; on a terminal and off it."""

from __future__ import annotations

import io
import logging

from sqlrl.evaluation.progress import (
    Part,
    Progress,
    clock_text,
    finish_line,
    open_part,
    pause_line,
    resume_line,
)


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


class Terminal(io.StringIO):
    def isatty(self):
        return True


def plan():
    return [
        Part("arm 1 of 2 base: evaluate", "task", 4),
        Part("arm 2 of 2 grpo: train", "step", 3),
        Part("arm 2 of 2 grpo: evaluate", "task", 4),
    ]


def test_clock_text():
    assert [clock_text(s) for s in (0, 59.4, 61, 3600, 3725)] == [
        "0:00",
        "0:59",
        "1:01",
        "1:00:00",
        "1:02:05",
    ]


def test_eta_is_a_lower_bound_until_every_kind_left_is_timed(caplog):
    clock = Clock()
    pr = Progress("quickstart", plan(), stream=io.StringIO(), clock=clock)
    with caplog.at_level(logging.INFO, logger="sqlrl.progress"):
        h = pr.open(0)
        assert pr.line() == "[quickstart] arm 1 of 2 base: evaluate task 0 of 4 | 0:00 elapsed | ETA ?"
        clock.t += 20  # 2 tasks in 20 s: 10 s a task; 2 + 4 tasks left = 60 s, steps not timed yet
        h.update(2)
        assert pr.line() == "[quickstart] arm 1 of 2 base: evaluate task 2 of 4 | 0:20 elapsed | ETA >= 1:00"
        clock.t += 20
        h.update(2)
        h.close()
        t = pr.open(1)
        clock.t += 90  # a step takes 90 s: 2 steps + 4 tasks left = 180 + 40 s
        t.update(1)
        t.set_postfix(reward="0.500")
        assert pr.line() == (
            "[quickstart] arm 2 of 2 grpo: train step 1 of 3 | 2:10 elapsed | ETA 3:40 | reward 0.500"
        )
    # off a terminal: a log line when a part starts or ends, and at most every 30 s in between
    assert caplog.messages == [
        "[quickstart] arm 1 of 2 base: evaluate task 0 of 4 | 0:00 elapsed | ETA ?",
        "[quickstart] arm 1 of 2 base: evaluate task 4 of 4 | 0:40 elapsed | ETA >= 0:40",
        "[quickstart] arm 2 of 2 grpo: train step 0 of 3 | 0:40 elapsed | ETA >= 0:40",
        "[quickstart] arm 2 of 2 grpo: train step 1 of 3 | 2:10 elapsed | ETA 3:40",
    ]


def test_sft_steps_are_timed_apart_from_grpo_steps():
    clock = Clock()
    parts = [
        Part("arm 1 of 2 sft: train", "step", 4, pace="sft step"),
        Part("arm 2 of 2 grpo: train", "step", 3),
        Part("arm 2 of 2 grpo: evaluate", "task", 2),
    ]
    pr = Progress("x", parts, stream=io.StringIO(), clock=clock)
    h = pr.open(0)
    for _ in range(4):  # 1 s an SFT step
        clock.t += 1
        h.update(1)
    h.close()
    g = pr.open(1)
    clock.t += 10  # 10 s a GRPO step: 2 steps left = 20 s; tasks not timed yet; SFT's 1 s a step not used
    g.update(1)
    assert pr.line() == "[x] arm 2 of 2 grpo: train step 1 of 3 | 0:14 elapsed | ETA >= 0:20"


def test_a_resumed_part_counts_its_earlier_units_as_done_and_skipped_parts_as_finished():
    clock = Clock()
    pr = Progress("x", plan(), stream=io.StringIO(), clock=clock)
    pr.skip(0)
    h = pr.open(1, total=3, initial=2)  # resumed from step 2: one step left
    clock.t += 30
    h.update(1)
    assert pr.line() == "[x] arm 2 of 2 grpo: train step 3 of 3 | 0:30 elapsed | ETA ?"  # tasks untimed


def test_on_a_terminal_the_line_is_redrawn_in_place_and_ends_with_a_newline():
    clock, term = Clock(), Terminal()
    pr = Progress("t", [Part("evaluate", "task", 2)], stream=term, clock=clock)
    h = pr.open(0)
    clock.t += 5
    h.update(1)
    finish_line()
    text = term.getvalue()
    assert text.startswith("\r[t] evaluate task 0 of 2 | 0:00 elapsed | ETA ?")
    assert "\r[t] evaluate task 1 of 2 | 0:05 elapsed | ETA 0:05" in text and text.endswith("\n")
    assert text.count("\n") == 1


def test_open_part_without_a_plan():
    assert open_part(False, title="t", label="l", kind="step", total=3) is None
    seen = []
    opener = lambda total, initial: seen.append((total, initial)) or "handle"  # noqa: E731
    assert open_part(opener, title="t", label="l", kind="step", total=3, initial=1) == "handle"
    assert seen == [(3, 1)]


def screen(text: str) -> list[str]:
    """What a terminal shows after `text`: a carriage return goes back to the start of the row, a newline
    down to a new row; characters overwrite."""
    rows, col = [[]], 0
    for ch in text:
        if ch == "\r":
            col = 0
        elif ch == "\n":
            rows.append([])
            col = 0
        else:
            row = rows[-1]
            row.extend(" " * (col + 1 - len(row)))
            row[col] = ch
            col += 1
    return ["".join(r).rstrip() for r in rows if "".join(r).strip()]


def say(term, message: str) -> None:
    """A log record as the CLI's console handler writes it: above the progress line."""
    line = pause_line()
    term.write(message + "\n")
    resume_line(line)


def test_on_a_terminal_messages_go_above_the_line_and_a_finished_part_stays_as_it_ended():
    clock, term = Clock(), Terminal()
    pr = Progress(
        "q",
        [Part("arm 1 of 2 base: evaluate", "task", 2), Part("arm 2 of 2 grpo: train", "step", 3)],
        stream=term,
        clock=clock,
    )
    h = pr.open(0)
    clock.t += 10
    h.update(2)
    h.close()
    say(term, "[experiment] grpo: training")  # the next part's header: the finished line is not redrawn
    t = pr.open(1)
    clock.t += 30
    t.update(1)
    say(term, "a warning")  # inside a part: the line is drawn again below the message
    finish_line()
    assert screen(term.getvalue()) == [
        "[q] arm 1 of 2 base: evaluate task 2 of 2 | 0:10 elapsed | ETA ?",  # steps not timed yet
        "[experiment] grpo: training",
        "a warning",
        "[q] arm 2 of 2 grpo: train step 1 of 3 | 0:40 elapsed | ETA 1:00",
    ]
