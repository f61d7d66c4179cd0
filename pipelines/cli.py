"""``tfm``: the command line for runs, single stages, status, translation, deployments and UIs.

The parser, the dispatch and the one-line error report; what each command does is in
``pipelines.commands``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from corpora import CorpusError
from filesystem.storage import StorageError
from parsing.trees import TreebankError
from pipelines import commands, console, environment, signals
from pipelines.commands import PROG
from serving import ServingError
from tasks.framework.config import ConfigError
from tasks.framework.results import StageError


def _add_set(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set train.steps=200 (repeatable)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Attention Is All You Need, as a Prefect + Ray + MLflow pipeline.",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="debug logging, and the libraries' own lines (Ray Data, MLflow, warnings) "
        "on the console",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("version", help="print the version")
    p.set_defaults(func=commands.cmd_version)

    p = sub.add_parser("run", help="run the whole pipeline of a config as a Prefect flow")
    p.add_argument("config", help="YAML run config, e.g. configs/quickstart.yaml")
    p.add_argument(
        "--force",
        action="append",
        metavar="STAGE",
        help="rerun STAGE and everything downstream (repeatable)",
    )
    _add_set(p)
    p.set_defaults(func=commands.cmd_run)

    p = sub.add_parser("stage", help="run one stage (its inputs must exist)")
    p.add_argument("name", help="stage name, e.g. download, clean, tokenizer, shard, train")
    p.add_argument("--config", required=True, help="YAML run config")
    p.add_argument("--force", action="store_true", help="rerun even if up to date")
    p.add_argument(
        "--accept",
        action="store_true",
        help="keep the stale output as up to date for the current config, inputs and "
        "code without running (after a change you know is harmless; recorded)",
    )
    _add_set(p)
    p.set_defaults(func=commands.cmd_stage)

    p = sub.add_parser("status", help="each stage: up to date, stale or missing, and why")
    p.add_argument("config", help="YAML run config")
    p.add_argument(
        "--verify",
        action="store_true",
        help="check every file's sha256 (default: sizes, Parquet footers, small files' sha256)",
    )
    _add_set(p)
    p.set_defaults(func=commands.cmd_status)

    _add_set(_tracking_parser(sub))
    _translate_parser(sub)
    _evaluate_parser(sub)
    _serve_parser(sub)
    _export_parser(sub)
    _import_parser(sub)
    _server_parsers(sub)
    return parser


def _serve_parser(sub: Any) -> None:
    """``tfm serve``: a registered version over HTTP on Ray Serve."""
    p = sub.add_parser(
        "serve",
        help="serve a registered model over HTTP on Ray Serve (MLflow's /invocations), "
        "batching the requests of many clients",
    )
    p.add_argument(
        "--model",
        required=True,
        help="the registered model, models:/NAME@ALIAS (followed as it moves) or "
        "models:/NAME/VERSION",
    )
    p.add_argument(
        "--config",
        required=True,
        help="run config: its serve section (address, token, replicas, batching, limits), its "
        "MLflow registry and its Ray",
    )
    _add_set(p)
    p.set_defaults(func=commands.cmd_serve)


def _export_parser(sub: Any) -> None:
    """``tfm export``: a checkpoint or a registered model as another toolkit's folder."""
    p = sub.add_parser(
        "export",
        help="a checkpoint or registered model as a CTranslate2 or Hugging Face Marian folder",
    )
    p.add_argument("--to", required=True, choices=["ctranslate2", "marian"], help="what to write")
    p.add_argument("--out", required=True, help="the folder to write")
    p.add_argument(
        "--model", help="a registered model's URI, e.g. models:/transformer-translator@champion"
    )
    p.add_argument("--checkpoint", help="or a checkpoint (model.pt, or a folder holding one) ...")
    p.add_argument("--tokenizer", help="... and its tokenizer folder (spm.model)")
    p.add_argument(
        "--quantization",
        default="float32",
        help="ctranslate2: float32 (the default: the model's own outputs), int8, int8_float16, "
        "bfloat16, float16, ... (the distill flow's export stage takes export.quantization, "
        "int8 by default)",
    )
    p.add_argument(
        "--config",
        help="run config whose MLflow tracking URI to use (with "
        "--checkpoint, also its decoding, written into a CTranslate2 export)",
    )
    p.add_argument("--tracking-uri", help="MLflow tracking URI (overrides --config)")
    _add_set(p)
    p.set_defaults(func=commands.cmd_export)


def _import_parser(sub: Any) -> None:
    """``tfm import fairseq``: another toolkit's checkpoint as a registered model."""
    p = sub.add_parser("import", help="another toolkit's checkpoint as a registered model")
    isub = p.add_subparsers(dest="import_command", required=True, metavar="TOOLKIT")
    p = isub.add_parser(
        "fairseq",
        help="a fairseq transformer checkpoint, its joined dictionary and its subword-nmt codes "
        "(the stages fairseq_import and register)",
    )
    p.add_argument("checkpoint", help="the fairseq checkpoint, e.g. checkpoint_best.pt")
    p.add_argument("--dict", required=True, help="the folder of dict.<src>.txt and dict.<tgt>.txt")
    p.add_argument("--bpe", required=True, help="subword-nmt's BPE codes file")
    p.add_argument(
        "--config",
        required=True,
        help="run config: its language pair, tokenizer.lowercase and tokenizer.moses (how the "
        "text was prepared before BPE), decoding, registry and work dir",
    )
    p.add_argument("--force", action="store_true", help="import and register again")
    _add_set(p)
    p.set_defaults(func=commands.cmd_import_fairseq)


def _server_parsers(sub: Any) -> None:
    """``tfm deploy`` (Prefect deployments) and ``tfm ui`` (the MLflow and Prefect UIs)."""
    p = sub.add_parser(
        "deploy", help="create Prefect deployments with a schedule on a Prefect server"
    )
    p.add_argument("config", help="YAML run config")
    p.add_argument("--cron", help='cron schedule, e.g. "0 3 * * 1"')
    p.add_argument("--work-pool", default="transformer", help="Prefect work pool")
    p.add_argument("--stage", help="deploy the single-stage flow for this stage instead")
    _add_set(p)
    p.set_defaults(func=commands.cmd_deploy)

    p = sub.add_parser(
        "ui", help="print (or --start) the local MLflow and Prefect UIs on 127.0.0.1"
    )
    p.add_argument("config", nargs="?", help="run config whose tracking store to show")
    p.add_argument("--start", action="store_true", help="start both servers")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--mlflow-port", type=int, default=5000)
    p.add_argument("--prefect-port", type=int, default=4200)
    _add_set(p)
    p.set_defaults(func=commands.cmd_ui)


def _translate_parser(sub: Any) -> None:
    """``tfm translate``: a registered model or a checkpoint, stdin to stdout."""
    p = sub.add_parser("translate", help="translate stdin to stdout (one line per line)")
    p.add_argument(
        "--model", help="a registered model's URI, e.g. models:/transformer-translator@champion"
    )
    p.add_argument("--checkpoint", help="or a checkpoint (model.pt, or a folder holding one) ...")
    p.add_argument("--tokenizer", help="... and its tokenizer folder (spm.model)")
    p.add_argument(
        "--config",
        help="run config: its MLflow tracking URI, or its decoding settings with --checkpoint",
    )
    p.add_argument("--tracking-uri", help="MLflow tracking URI (overrides --config)")
    p.add_argument("--beam", type=int, help="beam size (default: the model's or config's)")
    p.add_argument(
        "--alpha", type=float, help="length penalty exponent (default: the model's or config's)"
    )
    p.add_argument(
        "--length-norm",
        choices=["gnmt", "fairseq"],
        help="the length penalty's form (default: the model's or config's)",
    )
    p.add_argument(
        "--n-best",
        type=int,
        default=1,
        help="the N best translations per line (<= beam), as LINE ||| TEXT ||| SCORE",
    )
    p.add_argument(
        "--engine", choices=["torch", "ctranslate2"], help="with --checkpoint: who decodes"
    )
    _add_set(p)
    p.set_defaults(func=commands.cmd_translate)


def _evaluate_parser(sub: Any) -> None:
    """``tfm evaluate``: a registered model or a checkpoint scored on test sets."""
    p = sub.add_parser(
        "evaluate",
        help="translate and score test sets with a registered model (or a checkpoint), "
        "--against another set by set; the figures are tagged on the version",
    )
    p.add_argument(
        "--model", help="a registered model's URI, e.g. models:/transformer-translator@champion"
    )
    p.add_argument("--checkpoint", help="or a checkpoint (model.pt, or a folder holding one) ...")
    p.add_argument("--tokenizer", help="... and its tokenizer folder (spm.model)")
    p.add_argument(
        "--config",
        help="run config: its test set (the download stage's), language pair, MLflow "
        "tracking URI, and decoding with --checkpoint",
    )
    p.add_argument(
        "--test-set",
        action="append",
        metavar="PREFIX_OR_TSV",
        help="aligned files PREFIX.<src> and PREFIX.<tgt> (plain or gzip) or a TSV of "
        "source<TAB>target (repeatable; replaces the config's test set)",
    )
    p.add_argument(
        "--against",
        metavar="MODEL_URI",
        help="compare with this registered model on the same references: the difference, "
        "its 95%% interval and p-value (paired bootstrap)",
    )
    p.add_argument(
        "--json",
        metavar="PATH",
        help="write the figures here, the table beside it (.md) and, with --against, a plot "
        "of the differences (.png)",
    )
    p.add_argument("--tracking-uri", help="MLflow tracking URI (overrides --config)")
    _add_set(p)
    p.set_defaults(func=commands.cmd_evaluate)


def _tracking_parser(sub: Any) -> argparse.ArgumentParser:
    """``tfm tracking replay WORKDIR|CONFIG``; returns the replay parser."""
    p = sub.add_parser(
        "tracking", help="MLflow tracking: send what an outage or a dead process left"
    )
    tsub = p.add_subparsers(dest="tracking_command", required=True, metavar="ACTION")
    p = tsub.add_parser(
        "replay",
        help="send the records a work dir's tracking journals hold "
        "(kept while the MLflow server was down, or left by a "
        "process that died) to the server, in order, once",
    )
    p.add_argument(
        "target",
        metavar="WORKDIR|CONFIG",
        help="a work dir (a folder, or s3://... / gs://...), or a YAML run config",
    )
    p.set_defaults(func=commands.cmd_tracking_replay)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.func in (commands.cmd_run, commands.cmd_stage, commands.cmd_serve):
        signals.stop_on_signals(PROG)
    with environment.started(args.verbose) as args.found_at_start, console.routed(args.verbose):
        try:
            return args.func(args)
        except ConfigError as exc:
            print(f"{PROG}: config error: {exc}", file=sys.stderr)
            return 2
        except (KeyboardInterrupt, SystemExit) as exc:
            signum = signals.stop_signal()
            if signum is not None:
                signals.exit_now(signum)
            if isinstance(exc, SystemExit):
                raise
            print(
                signals.stop_line(2), file=sys.stderr
            )  # a KeyboardInterrupt of its own: as Ctrl-C
            return 130
        except Exception as exc:
            signum = signals.stop_signal(0.0)
            if signum is not None:  # what a stop broke on the way out (a server gone with it)
                signals.exit_now(signum)
            if args.verbose:
                raise
            print(f"{PROG}: {error_line(exc)}", file=sys.stderr)
            return 1


# Errors whose message is written for the user; anything else is named by its type.
USER_ERRORS = (StageError, CorpusError, StorageError, TreebankError, ServingError)


def error_line(exc: BaseException) -> str:
    """One line for any error: where it happened (the stage, from the exception's notes), its
    message (the first line), and for errors not written for users their type and where the
    whole story is."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    message = lines[0] if lines else "(no message)"
    if len(lines) > 1:
        message += " [...]"
    if not isinstance(exc, USER_ERRORS):
        message = f"{type(exc).__name__}: {message} (run with -v for the traceback)"
    where = "; ".join(getattr(exc, "__notes__", ()))
    return f"{where}: {message}" if where else message


if __name__ == "__main__":
    sys.exit(main())
