"""Progress bars: they say what runs and how far it got on stderr, and stay silent when disabled."""

from __future__ import annotations

from trtspec.progress import StatusBar, progress_bar


def test_status_bar_shows_the_description_and_the_latest_status(capsys):
    with StatusBar("epoch 1/2", total=2) as bar:
        bar.advance(1, "loss 2.31")
        bar.advance(1, "loss 1.50")
    err = capsys.readouterr().err
    assert "epoch 1/2" in err and "2/2" in err and "loss 1.50" in err


def test_progress_bar_counts_its_steps(capsys):
    with progress_bar("build engines", total=3) as advance:
        for _ in range(3):
            advance()
    err = capsys.readouterr().err
    assert "build engines" in err and "3/3" in err


def test_disabled_bars_print_nothing(capsys):
    with StatusBar("epoch 1/1", total=1, enabled=False) as bar:
        bar.advance(1, "loss 1.0")
    with progress_bar("build", total=1, enabled=False) as advance:
        advance()
    assert capsys.readouterr().err == ""
