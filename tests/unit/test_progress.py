"""The training console's progress lines and collapse warning."""

from __future__ import annotations

import io

from training.progress import Progress, duration


def test_durations_read_as_a_person_would():
    assert [duration(s) for s in (0, 12.4, 245, 3725)] == ["0s", "12s", "4m05s", "1h02m"]


def test_a_line_per_logging_step_with_eta_and_the_last_validation(monkeypatch):
    clock = iter([100.0, 130.0, 160.0])
    monkeypatch.setattr("training.progress.time.time", lambda: next(clock))
    out = io.StringIO()
    progress = Progress(total=100, start_step=20, out=out)  # resumed at step 20
    metrics = {"loss": 4.25, "lr": 1e-3, "target_tokens_per_s": 2345.6}
    assert progress.step(21, {}) is None  # not a logging step: nothing
    line = progress.step(30, metrics)  # 10 steps in 30 s: 70 to go take 210 s
    assert line == (
        "train step 30/100 (30%) | loss 4.250 | lr 1.00e-03 | 2,346 tgt tok/s | "
        "30s elapsed, ETA 3m30s"
    )
    progress.validated(30, {"val_ppl": 12.345, "val_encoder_spread": 0.4})
    assert "dev ppl 12.35 | 1m00s elapsed, ETA 1m00s" in progress.step(60, metrics)
    assert out.getvalue().count("\n") == 2


def test_a_collapsed_encoder_warns_and_a_healthy_one_does_not():
    out = io.StringIO()
    progress = Progress(total=10, start_step=0, spread_floor=0.05, out=out)
    assert progress.validated(5, {"val_encoder_spread": 0.31}) is None
    warning = progress.validated(10, {"val_encoder_spread": 0.012})
    assert warning.startswith("WARNING step 10: val_encoder_spread 0.012 < 0.05")
    assert out.getvalue() == warning + "\n"


def test_other_ranks_print_nothing():
    out = io.StringIO()
    progress = Progress(total=10, start_step=0, enabled=False, out=out)
    progress.step(5, {"loss": 1.0, "lr": 1e-3})
    assert out.getvalue() == ""


def test_translate_progress_writes_a_line_per_tenth_when_not_at_a_terminal():
    from serving.translate_progress import Progress as TranslateProgress

    out = io.StringIO()
    progress = TranslateProgress(200, out=out)
    for n in (7, 13, 30, 50, 100):  # batches of uneven sizes: 7, 20, 50, 100, 200 done
        progress.update(n)
    progress.close()
    lines = out.getvalue().splitlines()
    assert [line.split(" sentences")[0] for line in lines] == [
        "translate 20/200",
        "translate 50/200",
        "translate 100/200",
        "translate 200/200",
    ]
    assert all("sent/s" in line and "ETA" in line for line in lines)
    assert lines[-1].endswith("ETA 00:00")


def test_one_line_says_where_training_starts():
    out = io.StringIO()
    fresh = Progress(total=100, start_step=0, out=out).begun(2)
    assert fresh == "train starting: 100 steps, 2 worker(s)"
    resumed = Progress(total=100, start_step=40, out=out).begun(2)
    assert resumed.startswith("train resuming from step 40/100")
    assert out.getvalue() == fresh + "\n" + resumed + "\n"


def test_the_line_of_a_validating_step_shows_that_validation():
    out = io.StringIO()
    progress = Progress(total=10, start_step=0, eval_every=5, spread_floor=0.1, out=out)
    metrics = {"loss": 2.0, "lr": 1e-3}
    assert progress.step(4, metrics) is not None  # no validation at step 4: printed at once
    assert progress.step(5, metrics) is None  # held for the validation that follows it
    progress.validated(5, {"val_ppl": 7.0, "val_bleu": 12.3, "val_encoder_spread": 0.4})
    assert progress.step(10, metrics) is None  # the last step validates too
    warning = progress.validated(10, {"val_ppl": 5.0, "val_bleu": 20.0, "val_encoder_spread": 0.01})
    lines = out.getvalue().splitlines()
    assert [line.split(" (")[0] for line in lines[:3]] == [
        "train step 4/10",
        "train step 5/10",
        "train step 10/10",
    ]
    assert "dev ppl" not in lines[0]
    assert "dev ppl 7.00 | dev BLEU 12.3" in lines[1]
    assert "dev ppl 5.00 | dev BLEU 20.0" in lines[2]  # the last validation's, not the one before
    assert lines[3] == warning and len(lines) == 4


def test_a_held_line_is_not_lost_when_its_validation_says_nothing():
    out = io.StringIO()
    progress = Progress(total=10, start_step=0, eval_every=5, out=out)
    progress.step(5, {"loss": 2.0, "lr": 1e-3})
    progress.validated(5, {})  # nothing measured: the line waits for the next step
    progress.step(6, {"loss": 1.5, "lr": 1e-3})
    assert [line.split(" (")[0] for line in out.getvalue().splitlines()] == [
        "train step 5/10",
        "train step 6/10",
    ]
