"""benchmarks/peers/ (``make bench-peers``) and benchmarks/gpu_peers.py: the peers' commands
say the recipe, and their logs are read into the figures the table shows."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import gpu_peers  # noqa: E402
from peers import decoding, procs, report, run, ttb  # noqa: E402
from peers import eole as peers_eole  # noqa: E402
from peers import fairseq as peers_fairseq  # noqa: E402
from peers import ours as peers_ours  # noqa: E402
from peers.env import Peer, Recipe, Shape  # noqa: E402

from training.data import TokenData  # noqa: E402
from transformer_core import presets  # noqa: E402
from transformer_core.schedule import learning_rate  # noqa: E402

PEER = Peer("fairseq", Path("venv"))


def _fairseq_line(update: int, wpb: float, wps: float) -> str:
    stats = {"epoch": 1, "update": 0.1, "loss": "12.5", "wps": str(wps), "wpb": str(wpb),
             "num_updates": str(update)}  # fmt: skip
    return f"2026-11-28 16:00:00 | INFO | train_inner | {json.dumps(stats)}"


def test_fairseq_rate_counts_the_intervals_after_the_warm_up():
    log = "\n".join(
        ["2026-11-28 | INFO | fairseq_cli.train | model transformer"]
        + [_fairseq_line(10, 7000.0, 100.0)]  # the warm-up interval: left out
        + [_fairseq_line(20, 7000.0, 3500.0), _fairseq_line(30, 6000.0, 2000.0)]
    )
    rates = peers_fairseq.train_rates(log, 10)
    # 70,000 tokens in 20 s, then 60,000 in 30 s
    assert rates["target_tokens_per_s"] == pytest.approx(130_000 / 50)
    assert rates["target_tokens_per_update"] == pytest.approx(6500)
    assert (rates["timed_updates"], rates["timed_seconds"]) == (20, pytest.approx(50.0))
    with pytest.raises(ValueError, match="1 train_inner lines"):
        peers_fairseq.train_rates(_fairseq_line(10, 1.0, 1.0), 10)


def test_fairseq_generate_log_gives_its_time_and_hypotheses_in_order():
    log = "\n".join(
        [
            "S-1\ta dog .", "H-1\t-0.5\tein hund .", "D-1\t-0.5\tein hund .",
            "S-0\ta cat .", "D-0\t-0.4\teine katze .",
            "2026-11-28 | INFO | fairseq_cli.generate | Translated 2 sentences (9 tokens) in 0.5s "
            "(4.00 sentences/s, 18.00 tokens/s)",
        ]
    )  # fmt: skip
    rates = peers_fairseq.generate_rates(log)
    assert (rates["sentences"], rates["output_tokens"], rates["decode_seconds"]) == (2, 9, 0.5)
    assert peers_fairseq.hypotheses(log) == ["eine katze .", "ein hund ."]


def test_fairseq_train_command_is_the_recipe():
    cmd = peers_fairseq.train_command(PEER, Path("bin"), Path("ck"), Shape(), Recipe(), 30, 10)
    text = " ".join(cmd)
    for flag in ("--max-tokens 4096", "--update-freq 2", "--encoder-layers 4",
                 "--encoder-embed-dim 128", "--decoder-ffn-embed-dim 256", "--dropout 0.3",
                 "--label-smoothing 0.1", "--lr-scheduler inverse_sqrt", "--max-update 30",
                 "--share-all-embeddings", "--cpu"):  # fmt: skip
        assert flag in text, flag
    assert "--distributed-rank" not in text and "--ddp-backend" not in text
    # Rank 1 of two: fairseq's own data parallelism over gloo, told its rank (fairseq 0.12.3
    # cannot take torchrun's rendezvous without CUDA), each accumulating half the batches, so
    # an update holds the same 2 x 4,096 tokens.
    two = " ".join(
        peers_fairseq.train_command(
            PEER, Path("bin"), Path("ck"), Shape(), Recipe(), 30, 10, rank=(1, 2, 29500)
        )
    )
    for flag in ("--max-tokens 4096", "--update-freq 1", "--distributed-world-size 2",
                 "--distributed-rank 1", "--distributed-init-method tcp://127.0.0.1:29500",
                 "--distributed-no-spawn", "--distributed-backend gloo",
                 "--ddp-backend legacy_ddp", "--cpu"):  # fmt: skip
        assert flag in two, flag
    with pytest.raises(ValueError, match="update_freq 2 is not split by 3"):
        peers_fairseq.train_command(
            PEER, Path("b"), Path("c"), Shape(), Recipe(), 30, 10, rank=(0, 3, 1)
        )
    gpu = peers_fairseq.train_command(
        PEER, Path("bin"), Path("ck"), Shape(), Recipe(), 30, 10, gpu=True, fp16=True
    )
    assert "--fp16" in gpu and "--cpu" not in gpu
    linear = peers_fairseq.train_command(
        PEER, Path("bin"), Path("ck"), Shape(), Recipe(warmup=5, decay="linear"), 30, 10
    )
    # linear to zero at the run's last update, as ours decays (fairseq: lr * (1 - done)^power)
    for flag in ("--lr-scheduler polynomial_decay", "--warmup-updates 5", "--power 1",
                 "--end-learning-rate 0", "--total-num-update 30"):  # fmt: skip
        assert flag in " ".join(linear), flag
    with pytest.raises(ValueError, match="decay 'cosine'"):
        peers_fairseq.train_command(
            PEER, Path("b"), Path("c"), Shape(), Recipe(decay="cosine"), 30, 10
        )
    only = peers_fairseq.preprocess_command(
        PEER, Path("t"), ("en", "de"), Path("d"), splits=("train",)
    )
    assert "--trainpref" in only and "--testpref" not in only


def _eole_step(step: int, sents: float, src: float, tgt: float, per: float, rate: float) -> str:
    # eole 0.6's own format (eole/utils/statistics.py, Statistics.output)
    return (  # noqa: UP031 (eole's own %-format, copied as it is)
        "[2026-11-28 16:00:00,000 INFO] Step %s; acc: %2.1f; ppl: %5.2f; xent: %2.2f; aux: %2.3f; "
        "mtp: %2.3f; attn_ent: %2.3f; lr: %7.2e; sents: %7.0f; bsz: %4.0f/%4.0f/%2.0f; "
        "%3.0f/%3.0f tok/s; %6.0f sec;"
    ) % (
        f"{step:2d}/{30:5d}",
        1.0,
        9000.0,
        9.1,
        0,
        0,
        0,
        1e-4,
        sents,
        src,
        tgt,
        per,
        rate,
        rate,
        40,
    )


def test_eole_rate_counts_the_intervals_after_the_warm_up():
    log = "\n".join(
        [
            _eole_step(10, 5000, 3000, 3500, 250, 10.0),
            _eole_step(20, 5000, 3000, 3500, 250, 3500.0),  # 20 batches: 70,000 tokens, 20 s
            _eole_step(30, 4000, 3000, 3000, 200, 2000.0),  # 20 batches: 60,000 tokens, 30 s
        ]
    )
    rates = peers_eole.train_rates(log, 10)
    assert rates["target_tokens_per_s"] == pytest.approx(130_000 / 50)
    assert rates["timed_updates"] == 20 and rates["timed_seconds"] == pytest.approx(50)
    times = "Step 0 time (s): 1.50\nSubsequent prediction time including all (s): 12.25\n"
    assert peers_eole.predict_rates(times)["decode_seconds"] == pytest.approx(13.75)


def test_eole_config_is_the_recipe(tmp_path):
    body = peers_eole.config(tmp_path, tmp_path, ("en", "de"), Shape(), Recipe(), 30, 10)
    training, model = body["training"], body["model"]
    assert (training["batch_size"], training["accum_count"], training["train_steps"]) == (
        4096,
        [2],
        30,
    )
    assert (training["label_smoothing"], training["dropout"], training["gpu_ranks"]) == (
        0.1,
        [0.3],
        [],
    )
    assert (model["layers"], model["hidden_size"], model["transformer_ff"], model["heads"]) == (
        4,
        128,
        256,
        4,
    )
    assert model["share_embeddings"] and body["share_vocab"]
    # eole's noam is the paper's curve times learning_rate: its peak, at the warm-up's last
    # update, is the recipe's lr (fairseq's --lr), and it decays after
    assert training["decay_method"] == "noam" and training["warmup_steps"] == Recipe().warmup
    peak = learning_rate(Recipe().warmup, 128, Recipe().warmup, training["learning_rate"])
    assert peak == pytest.approx(Recipe().lr)
    assert learning_rate(4 * Recipe().warmup, 128, Recipe().warmup, training["learning_rate"]) == (
        pytest.approx(Recipe().lr / 2)
    )
    gpu = peers_eole.config(
        tmp_path, tmp_path, ("en", "de"), Shape(), Recipe(), 30, 10, gpu=True, bf16=True
    )
    assert gpu["training"]["gpu_ranks"] == [0] and gpu["training"]["compute_dtype"] == "bf16"


def test_the_table_compares_best_layout_with_best_and_a_problem_is_one_row():
    rate = {
        "layout": "x",
        "target_tokens_per_update": 7000,
        "timed_updates": 20,
        "timed_seconds": 50,
    }
    train = {
        "fairseq": rate | {"target_tokens_per_s": 2000.0},
        report.FAIRSEQ_2P: rate | {"target_tokens_per_s": 2400.0},
        "eole": {"layout": "y", "problem": "eole: installing eole failed"},
        "ours (Ray Train, as tfm run)": rate | {"target_tokens_per_s": 3000.0},
        "ours (one process)": rate | {"target_tokens_per_s": 2600.0},
    }
    assert report.best_of(train, report.FAIRSEQ) == report.FAIRSEQ_2P
    assert report.best(train, report.OURS) == 3000.0
    assert report.best_of({"fairseq": {"problem": "no"}}, report.FAIRSEQ) is None
    results = {
        "train": train,
        "decode": {},
        "ours_over_fairseq": 1.25,
        "best_layouts": {"ours": "ours (Ray Train, as tfm run)", "fairseq": report.FAIRSEQ_2P},
    }
    text = report.tables(results)
    assert (
        "train tokens/s ours/fairseq (best layouts): 1.25 "
        "(ours (Ray Train, as tfm run) / fairseq (2 processes))"
    ) in text.splitlines()
    assert "| eole | not run: eole: installing eole failed |" in text
    # Every row against fairseq's best layout.
    assert "| ours (Ray Train, as tfm run) | x | 3,000 | 1.25 |" in text
    assert "| fairseq | x | 2,000 | 0.83 |" in text


def test_a_parse_failure_is_a_problem_line_not_a_crash():
    def broken() -> dict:
        return peers_fairseq.train_rates("no lines", 10)

    assert procs.guarded("fairseq training", broken)["problem"].startswith(
        "fairseq training: ValueError: fairseq logged 0 train_inner lines"
    )


def test_gpu_peers_write_the_same_rows_as_words_and_take_our_presets(tmp_path):
    lens = np.array([3, 2])
    src = np.array([5, 6, 2, 7, 2], dtype=np.uint16)  # EOS (2) ends each row
    tgt = np.array([8, 2, 9, 10, 2], dtype=np.uint16)
    data = TokenData(src, np.r_[0, np.cumsum(lens)], tgt, np.r_[0, np.cumsum([2, 3])])
    gpu_peers.write_text(data, tmp_path, rows=2, valid_rows=1)
    assert (tmp_path / "train.en").read_text().splitlines() == ["w5 w6", "w7"]
    assert (tmp_path / "train.de").read_text().splitlines() == ["w8", "w9 w10"]
    assert (tmp_path / "valid.en").read_text().splitlines() == ["w5 w6"]
    shape = gpu_peers.shape_of(presets.get("big"))
    assert (shape.layers, shape.d_model, shape.d_ff, shape.heads) == (6, 1024, 4096, 16)


def test_a_gpu_peer_without_its_wheels_is_one_line(tmp_path):
    peer = gpu_peers.ensure_gpu("eole", tmp_path / "missing", root=tmp_path / "envs")
    assert (
        peer.problem
        == f"eole: no wheels folder {tmp_path / 'missing'} (gpu_peers.py wheels makes it)"
    )
    assert not (tmp_path / "envs").exists()  # nothing made before the check


def test_a_shorter_warm_up_reaches_the_recipe_s_peak_in_every_toolkit(tmp_path):
    """``--warmup``: fairseq and eole get it as their warm-up; ours scales the schedule so that
    its peak learning rate is still the recipe's (fairseq's --lr), only sooner."""
    recipe = run.recipe(argparse.Namespace(threads=2, warmup=300))
    assert (recipe.warmup, recipe.lr) == (300, Recipe().lr)
    ours = peers_ours.recipe_config(tmp_path, 600, 50, warmup=300)
    d_model, train = ours.model.d_model, ours.train
    assert train.warmup_steps == 300
    peak = learning_rate(300, d_model, 300, train.lr_scale)
    assert peak == pytest.approx(recipe.lr, rel=0.01)
    assert learning_rate(301, d_model, 300, train.lr_scale) < peak
    default = peers_ours.recipe_config(tmp_path, 600, 50).train
    assert learning_rate(default.warmup_steps, d_model, default.warmup_steps, default.lr_scale) == (
        pytest.approx(peak, rel=1e-6)
    )


def test_ours_takes_the_recipe_s_overrides_and_keeps_its_warm_up_scaling(tmp_path):
    """``benchmarks/peers ours plain --seed --set``: the overrides reach the config the Trainer
    gets; the bench's own settings (steps, warm-up) still apply on top."""
    config = peers_ours.recipe_config(
        tmp_path, 300, 50, warmup=200, overrides={"model.init": "torch", "seed": 4321}
    )
    recipe = peers_ours.recipe_config(tmp_path, 300, 50, warmup=200)
    assert (config.model.init, config.seed) == ("torch", 4321)
    assert (recipe.model.init, recipe.seed) == ("fairseq", 1234)
    assert (config.train.steps, config.train.warmup_steps) == (300, 200)
    assert config.train.lr_scale == recipe.train.lr_scale


def test_decoding_refuses_training_overrides_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        peers_ours.main(["decode", str(tmp_path), str(tmp_path / "model.pt"), "--seed", "3"])
    assert exc.value.code == 2
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert said.endswith(
        "--seed and --set are for training (ray, plain); decode reads the checkpoint"
    )


def _decoded(rate: float, bleu: float, **more) -> dict:
    return {"sentences": 1000, "decode_seconds": 1000 / rate, "wall_s": 30.0,
            "mean_output_tokens": 12.0, "bleu_tok_lc": bleu} | more  # fmt: skip


def test_the_same_weights_line_says_the_torch_rows_rate_share_and_both_bleus():
    torch_row, ct2_row = report.SAME_WEIGHTS
    decode = {
        report.GENERATE: _decoded(20.0, 35.02),
        "tfm translate, engine torch": _decoded(30.0, 36.0),
        torch_row: _decoded(50.0, 35.0, identical=0.994),
        ct2_row: _decoded(100.0, 34.98, identical=0.97),
    }
    text = report.tables({"train": {}, "decode": decode})
    assert (
        "decode sentences/s ours/fairseq-generate (same weights): 2.50 "
        "(identical hypotheses: 99.4%, BLEU ours 35.00 / fairseq 35.02)"
    ) in text.splitlines()
    assert f"| {ct2_row} | 100.0 | 5.00 | 10.0 | 30 | 12.0 | 34.98 | 97.0% |" in text
    assert "| tfm translate, engine torch | 30.0 | 1.50 | 33.3 | 30 | 12.0 | 36.00 | |" in text
    del decode[report.GENERATE]
    assert "decode sentences/s ours/fairseq-generate (same weights): n/a" in report.tables(
        {"train": {}, "decode": decode}
    )


def test_hypotheses_are_compared_as_subwords_and_scored_without_bpe(tmp_path, monkeypatch):
    assert decoding.identical(["a b@@ c", "d", "e"], ["a b@@ c", "d@@ e", "e"]) == pytest.approx(
        2 / 3
    )
    with pytest.raises(ValueError, match="2 hypotheses against 1"):
        decoding.identical(["a", "b"], ["a"])
    seen = {}

    def score_texts(hyps, refs, lang):
        seen["hyps"] = hyps
        return {"bleu_tok_lc": 1.0}

    monkeypatch.setattr("evaluation.bleu.score_texts", score_texts)
    (tmp_path / "clean").mkdir()
    (tmp_path / "clean" / "test.de").write_text("ein hund .\nzwei.\n", encoding="utf-8")
    corpus = run.Corpus(tmp_path, tmp_path / "text", ("en", "de"), {})
    result = {"hypotheses": ["ein hun@@ d .", "zwei ."], "pieces": True}
    scored = decoding.score(result, corpus)
    assert seen["hyps"] == ["ein hund.", "zwei."]  # BPE removed, then Moses-detokenized
    assert "pieces" not in scored and "tokenized" not in scored


def test_fairseq_generate_keeps_bpe_when_asked_and_ours_decodes_as_it():
    cmd = peers_fairseq.generate_command(PEER, Path("bin"), Path("c.pt"), 5, 4096, 50)
    kept = peers_fairseq.generate_command(PEER, Path("bin"), Path("c.pt"), 5, 4096, 50,
                                          remove_bpe=False)  # fmt: skip
    assert "--remove-bpe" in cmd and "--remove-bpe" not in kept
    assert kept[kept.index("--max-len-a") : kept.index("--max-len-b") + 2] == [
        "--max-len-a", "1", "--max-len-b", "50"]  # fmt: skip
    decode = peers_ours.fairseq_decoding(5, "ctranslate2")
    assert (decode.beam_size, decode.alpha, decode.length_norm, decode.length_rule) == (
        5, 1.0, "fairseq", "fairseq")  # fmt: skip
    assert (decode.max_len_offset, decode.max_tokens_per_batch, decode.engine) == (
        50, 4096, "ctranslate2")  # fmt: skip


def test_no_train_decodes_the_models_an_earlier_run_left(tmp_path):
    (tmp_path / "fairseq" / "checkpoints").mkdir(parents=True)
    (tmp_path / "fairseq" / "checkpoints" / "checkpoint_last.pt").write_bytes(b"")
    (tmp_path / "ours-ray" / "final").mkdir(parents=True)
    (tmp_path / "ours-ray" / "final" / "model.pt").write_bytes(b"")
    train = run.trained_before({"fairseq": PEER, "eole": Peer("eole", Path("v"))}, tmp_path)
    assert train["fairseq"]["reused"] and train["fairseq"]["data_bin"].endswith("data-bin")
    assert train["ours (Ray Train, as tfm run)"]["reused"]
    assert "not trained in" in train["eole"]["problem"]
    assert "not trained in" in train["ours (one process)"]["problem"]
    text = report.tables({"train": train, "decode": {}})
    assert "| fairseq | not trained in this run: " in text


def test_time_to_bleu_gives_fairseq_the_laptop_recipe_s_model_and_schedule(tmp_path):
    """``--time-to-bleu``: fairseq-train gets the laptop recipe's shape, its 2 x 1,024-token
    updates and the peak our schedule reaches at the end of its warm-up."""
    config = ttb.laptop_config(tmp_path, None)
    shape, recipe = ttb.fairseq_settings(config)
    model, train = config.model, config.train
    assert (shape.layers, shape.d_model, shape.d_ff, shape.heads) == (4, 128, 256, 4)
    assert (shape.dropout, shape.share) == (model.dropout, True)
    assert recipe.max_tokens * recipe.update_freq == train.tokens_per_step == 2048
    ours_peak = learning_rate(train.warmup_steps, model.d_model, train.warmup_steps, train.lr_scale)
    assert recipe.lr == pytest.approx(ours_peak, rel=1e-9)
    assert (recipe.warmup, recipe.decay) == (train.warmup_steps, train.decay)
    assert (recipe.adam_betas, recipe.adam_eps) == (train.adam_betas, train.adam_eps)
    cmd = peers_fairseq.train_command(
        PEER, tmp_path, tmp_path, shape, recipe, 3600, 50, rank=(0, 2, 1234)
    )
    assert cmd[cmd.index("--max-tokens") + 1] == "1024"
    assert cmd[cmd.index("--update-freq") + 1] == "1"  # each of two ranks: one batch an update
    assert cmd[cmd.index("--dropout") + 1] == str(model.dropout)


def test_fairseq_generate_scores_a_split_without_sentencepiece_marks(tmp_path):
    cmd = peers_fairseq.generate_command(
        PEER, tmp_path, tmp_path / "avg.pt", 5, 4096, 50, remove_bpe="sentencepiece",
        subset="valid",
    )  # fmt: skip
    assert cmd[cmd.index("--gen-subset") + 1] == "valid"
    assert cmd[cmd.index("--remove-bpe") + 1] == "sentencepiece"
    plain = peers_fairseq.generate_command(PEER, tmp_path, tmp_path / "avg.pt", 5, 4096, 50)
    assert plain[plain.index("--gen-subset") + 1] == "test"
    assert plain[plain.index("--remove-bpe") + 1] == "--cpu"  # subword-nmt's marks: no value


def test_time_to_bleu_is_the_first_minute_ours_reaches_fairseq_s_final_score():
    checkpoints = [(100 * i, 0.9 * i, Path(f"c{i}")) for i in range(1, 8)]
    assert ttb.chosen(checkpoints, 3.0, 4) == [Path("c1"), Path("c2"), Path("c3")]
    assert ttb.chosen(checkpoints, 5.5, 4) == [Path(f"c{i}") for i in (3, 4, 5, 6)]
    assert ttb.chosen(checkpoints, 0.5, 4) == []
    rows = [
        {"minute": 1.0, "fairseq_updates": 0},  # neither has a checkpoint yet
        {"minute": 2.0, "ours_test2016": 20.0, "fairseq_test2016": 10.0},
        {"minute": 3.0, "ours_test2016": 31.0, "fairseq_test2016": 25.0},
        {"minute": 4.0, "ours_test2016": 33.0, "fairseq_test2016": 30.5},
    ]
    found = ttb.time_to(rows, 4.0)
    assert found == {"fairseq_final_test2016": 30.5, "ours_minutes_to_it": 3.0, "T": 0.75}
    rows[2]["ours_test2016"] = 30.0
    assert ttb.time_to(rows, 4.0)["T"] == 1.0
    rows[3]["ours_test2016"] = 30.0
    assert ttb.time_to(rows, 4.0) | {"fairseq_final_test2016": None} == {
        "fairseq_final_test2016": None,
        "ours_minutes_to_it": None,
        "T": None,
    }


def test_a_training_past_its_budget_is_stopped_there(tmp_path):
    """Each toolkit trains for the budget: a command still running at its end is stopped (its
    process group, so that what it started goes too), and the run returns in seconds."""
    script = "import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)"
    started = ttb.run_for([[sys.executable, "-c", script]] * 2, None, tmp_path / "t.log", 1.0)
    assert time.time() - started < 30
    leftover = subprocess.run(["pgrep", "-f", "^sleep 60$"], capture_output=True, text=True)
    assert leftover.stdout == ""
    assert (tmp_path / "t.log").exists() and (tmp_path / "t.1.log").exists()


def test_no_train_decodes_the_checkpoints_a_time_to_bleu_run_kept(tmp_path):
    trained = {"data_bin": tmp_path / "bin", "checkpoints": [(100, 0.5, tmp_path / "c.pt")]}
    assert ttb.kept(trained, tmp_path) is trained
    assert ttb.trained_before(tmp_path) == trained
    with pytest.raises(SystemExit, match="trained.json does not exist"):
        ttb.trained_before(tmp_path / "other")
