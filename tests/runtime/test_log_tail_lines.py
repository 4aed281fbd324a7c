"""The job page's last log lines are what a terminal would leave on screen, and a cut is read from the file's size."""

from __future__ import annotations

from lucid_core.runtime.hosts.executor import FileTail
from lucid_core.runtime.surfaces.host_reads import last_lines


def test_a_progress_bar_rewritten_with_carriage_returns_shows_its_last_version():
    """`splitlines` split at every carriage return: a progress bar's 500 updates filled the page's 20 lines."""
    bar = "".join(f"\repoch 1: {k}/500" for k in range(1, 501))
    text = f"loading data\n{bar}\nepoch 1 done\r\n"
    assert last_lines(FileTail(text, len(text)), 20, 65536) == "loading data\nepoch 1: 500/500\nepoch 1 done"


def test_a_cut_tail_loses_its_partial_first_line_only_when_the_file_is_longer():
    whole = "first line\nsecond\n"
    assert last_lines(FileTail(whole, len(whole)), 20, len(whole)) == "first line\nsecond"
    # the same bytes as the end of a longer file: "first line" is the cut end of a line
    assert last_lines(FileTail(whole, 5000), 20, len(whole)) == "second"
    # bytes that are no UTF-8 come back as 3-byte characters: a short log is still whole
    binary = "\ufffd" * 30 + "\nend\n"
    assert last_lines(FileTail(binary, 32), 20, 64) == "\ufffd" * 30 + "\nend"


def test_the_count_of_lines_is_kept():
    text = "".join(f"line {k}\n" for k in range(50))
    assert last_lines(FileTail(text, len(text)), 3, 4096) == "line 47\nline 48\nline 49"
    assert last_lines(FileTail(text, len(text)), 0, 4096) == ""
