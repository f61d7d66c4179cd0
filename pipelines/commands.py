"""What each ``tfm`` command does; ``pipelines.cli`` parses the command line and reports errors."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from filesystem.redact import redact_uri, redacted
from pipelines import console, environment
from tasks.framework.config import ConfigError, RunConfig, load_config

PROG = "tfm"
_MODEL_OR_CHECKPOINT = (
    "give a registered model (--model URI) or a checkpoint (--checkpoint PATH --tokenizer DIR)"
)


def _overrides(items: list[str] | None) -> dict[str, Any]:
    """``--set key.path=value`` pairs; values are parsed as YAML (numbers, booleans, lists)."""
    import yaml

    parsed: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError(item, "an override must look like key.path=value")
        key, value = item.split("=", 1)
        parsed[key] = yaml.safe_load(value)
    return parsed


def _load(
    args: argparse.Namespace,
    path: str,
    overrides: list[str] | None = None,
    given: dict[str, Any] | None = None,
) -> RunConfig:
    """The command's config with its ``--set`` ``overrides`` and the values its own options
    ``given``, loaded and validated once, and the switches it needs set in the environment
    (``environment.configured``); what runs next is handed this."""
    start: environment.Start = args.found_at_start
    settings = {**_overrides(overrides), **(given or {})}
    config = load_config(path, settings, team_tracking_uri=start.tracking_uri)
    return environment.configured(config)


def cmd_version(args: argparse.Namespace) -> int:
    from tasks.framework.stage_fingerprint import code_version

    print(f"{PROG} {code_version()}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    config = _load(args, args.config, args.set)
    _ = config.store  # a store URI or credentials that cannot work: one line, before Prefect
    environment.logging_to(config.root, args.verbose)
    from pipelines import watchdog
    from pipelines.flows import Loaded, pipeline_flow

    watchdog.start()  # Prefect's server and a local Ray end with this process, however it ends

    results = pipeline_flow(
        config_path=str(Path(args.config).resolve()),
        force=list(args.force or []),
        # Prefect records these on its server; the flow runs ``loaded``, so the record needs no
        # password a --set gave (a mirror's).
        overrides=redacted(_overrides(args.set)),
        loaded=Loaded(config),  # the flow runs this config; the path and overrides name it
    )
    _print_summary(config, results)
    return 0


def _print_summary(config, results) -> None:
    from tasks.framework.runner import place
    from tasks.framework.workdir import open_workdir

    wd = open_workdir(config)
    print(f"\n{'stage':<12} {'result':<22} {'seconds':>8}  folder")
    for r in results:
        result = "ran" if r.ran else "up to date (skipped)"
        print(f"{r.stage:<12} {result:<22} {r.seconds:>8.1f}  {place(config, r.stage, wd)}")
    from pipelines.flows import scores

    stats = {r.stage: r.stats for r in results}
    shown = scores(results)
    if shown:
        print(
            "\nscores: "
            + ", ".join(
                f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items()
            )
        )
    if "register" in stats:
        print("registry: " + json.dumps(stats["register"]))
    print(f"\nMLflow UI:  {mlflow_ui_hint(config.tracking_uri)}")
    print(f"Both UIs:   {PROG} ui <config> --start   (MLflow and Prefect, bound to 127.0.0.1)")
    print(
        f"Run log:    {config.root / console.LOG_FILE}   (the libraries' lines; -v shows them here)"
    )


def mlflow_ui_hint(tracking_uri: str) -> str:
    """Where to see the runs: a tracking server's own address (it serves the UI), without its
    credentials; for a store (SQLite, a folder, a database) the command that serves one."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(tracking_uri)
    if parts.scheme in ("http", "https"):
        return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    return (
        f"{sys.executable} -m mlflow ui"
        f" --backend-store-uri {redact_uri(tracking_uri)} --host 127.0.0.1"
    )


def cmd_stage(args: argparse.Namespace) -> int:
    config = _load(args, args.config, args.set)
    environment.logging_to(config.root, args.verbose)
    from pipelines import watchdog
    from tasks.framework import graph, runner
    from tasks.framework.workdir import open_workdir

    graph.spec(config, args.name)
    wd = open_workdir(config)  # once for the command: every step below is handed it
    if args.accept:
        if args.force:
            raise ConfigError("", "--accept keeps the output as it is; --force reruns it: give one")
        result = runner.accept_stage(config, args.name, wd)
        print(f"{result.stage}: {result.reason}")
        print(runner.place(config, args.name, wd))
        return 0
    watchdog.start()  # a local Ray ends with this process, however it ends
    result = runner.tracked_stage(config, args.name, force=args.force, workdir=wd)
    print(f"{result.stage}: {'ran' if result.ran else 'up to date, skipped'} ({result.reason})")
    print(runner.place(config, args.name, wd))
    return 0


def cmd_tracking_replay(args: argparse.Namespace) -> int:
    """Send what the work dir's tracking journals hold to their MLflow servers; exit 1 if some
    is left (a server does not answer)."""
    from tasks.framework import mlflow_runs

    target = Path(args.target)
    if target.suffix in (".yaml", ".yml") and target.is_file():
        config = _load(args, args.target, args.set)
        left = mlflow_runs.replay_config(config, say=lambda line: print(f"tracking: {line}"))
    else:
        start: environment.Start = args.found_at_start
        left = mlflow_runs.replay_workdir(
            args.target, start.tracking_uri, say=lambda line: print(f"tracking: {line}")
        )
    return 1 if left else 0


def cmd_status(args: argparse.Namespace) -> int:
    config = _load(args, args.config, args.set)
    from tasks.framework import mlflow_runs, runner
    from tasks.framework.workdir import open_workdir

    rows = runner.status(config, full=args.verify, workdir=open_workdir(config))
    print(f"{'stage':<12} {'state':<11} why")
    for name, st in rows:
        print(f"{name:<12} {st.state:<11} {st.reason}")
    for line in mlflow_runs.killed(config):
        print(f"\n{line}")
    return 0


def cmd_translate(args: argparse.Namespace) -> int:
    import dataclasses

    from serving import stream

    if (args.model is None) == (args.checkpoint is None):
        raise ConfigError("", _MODEL_OR_CHECKPOINT)
    given = (("beam_size", args.beam), ("alpha", args.alpha), ("length_norm", args.length_norm))
    options = {k: v for k, v in given if v is not None}
    if args.n_best < 1:
        raise ConfigError("", f"--n-best {args.n_best} must be >= 1")
    if args.engine is not None and args.model is not None:
        raise ConfigError(
            "", "--engine applies to --checkpoint; a registered model decodes with its own engine"
        )
    if args.model is not None:
        tracking = args.tracking_uri
        if tracking is None and args.config:
            tracking = _load(args, args.config, args.set).tracking_uri
        n_best = {"n_best": args.n_best} if args.n_best > 1 else {}
        predict = stream.from_registry(args.model, tracking, params={**options, **n_best})
    else:
        if args.tokenizer is None:
            raise ConfigError(
                "", "--checkpoint needs --tokenizer DIR (the folder holding spm.model)"
            )
        decode = _load(args, args.config, args.set).decoding if args.config else None
        from serving.translator import DecodeConfig

        engine = {"engine": args.engine} if args.engine else {}
        decode = dataclasses.replace(decode or DecodeConfig(), **options, **engine)
        predict = stream.from_checkpoint(
            Path(args.checkpoint), Path(args.tokenizer), decode, n_best=args.n_best
        )
    stream.translate_stream(predict, sys.stdin.buffer, sys.stdout)
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    """``tfm evaluate`` (``pipelines.evaluate_command``), its config loaded once."""
    from pipelines import evaluate_command

    if (args.model is None) == (args.checkpoint is None):
        raise ConfigError("", _MODEL_OR_CHECKPOINT)
    config = _load(args, args.config, args.set) if args.config else None
    request = evaluate_command.Request(
        model=args.model,
        checkpoint=None if args.checkpoint is None else Path(args.checkpoint),
        tokenizer=None if args.tokenizer is None else Path(args.tokenizer),
        config=config,
        tracking_uri=args.tracking_uri or (config.tracking_uri if config else None),
        test_sets=list(args.test_set or []),
        against=args.against,
        json_path=None if args.json is None else Path(args.json),
    )
    return evaluate_command.run(request)


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve ``--model`` on Ray Serve until Ctrl-C or SIGTERM (docs/serving.md)."""
    import os
    import threading

    config = _load(args, args.config, args.set)
    from pipelines import signals, watchdog
    from serving import haproxy_ingress, registered_version, serve_launch
    from tasks.framework.runtime import ensure_ray

    settings = config.serve
    token = serve_launch.token_sha256(settings, os.environ)
    # Before Ray starts: a URI that names nothing fails in one line.
    name, version, alias = registered_version.resolve(args.model, config.tracking_uri)
    local = not (config.ray.address or os.environ.get("RAY_ADDRESS"))
    if local:  # the proxy will be on this machine
        serve_launch.check_port(settings.host, settings.port)
    ingress = haproxy_ingress.choose(settings.ingress, local)
    if ingress == "haproxy":  # read by Ray Serve's processes as the local Ray starts them
        environment.serve_ingress(haproxy_ingress.environment())
    watchdog.start()  # a local Ray ends with this process, however it ends
    ensure_ray(config.ray)
    try:
        loopback = local and config.ray.loopback
        url = serve_launch.deploy(args.model, config.tracking_uri, settings, token, loopback)
        signals.take_back()  # Ray's handlers took SIGTERM: it would end the command here
        scaling = settings.autoscaling
        replicas = (
            f"{settings.replicas} replica(s)"
            if scaling is None
            else f"{scaling.min_replicas} to {scaling.max_replicas} replicas"
        )
        followed = f", following @{alias}" if alias else ""
        where = f"{replicas}, {ingress} ingress" if local else replicas
        print(f"serving {name} version {version}{followed} on {url} ({where})", flush=True)
        print("Ctrl-C stops it", flush=True)
        threading.Event().wait()
    finally:
        serve_launch.undeploy()
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    import tempfile

    from serving.export import export, registered_files

    if (args.model is None) == (args.checkpoint is None):
        raise ConfigError("", _MODEL_OR_CHECKPOINT)
    with tempfile.TemporaryDirectory(prefix="tfm-export-") as tmp:
        if args.model is not None:
            tracking = args.tracking_uri or (
                _load(args, args.config, args.set).tracking_uri if args.config else None
            )
            checkpoint, tokenizer_dir, decode = registered_files(args.model, Path(tmp), tracking)
        elif args.tokenizer is None:
            raise ConfigError(
                "", "--checkpoint needs --tokenizer DIR (the folder holding spm.model)"
            )
        else:
            checkpoint, tokenizer_dir = Path(args.checkpoint), Path(args.tokenizer)
            decode = _load(args, args.config, args.set).decoding if args.config else None
        out = export(args.to, checkpoint, tokenizer_dir, Path(args.out), args.quantization, decode)
    print(out)
    return 0


def cmd_import_fairseq(args: argparse.Namespace) -> int:
    """The fairseq pipeline's stages for the files given (fairseq_import, register) through the
    pipelines' driver, under one MLflow parent run; a line a stage, then the registered
    version."""
    files = {"checkpoint": args.checkpoint, "dict_dir": args.dict, "bpe_codes": args.bpe}
    given = {f"fairseq.{key}": str(Path(value).resolve()) for key, value in files.items()}
    config = _load(args, args.config, args.set, given)
    environment.logging_to(config.root, args.verbose)
    from tasks.framework import graph, runner
    from tasks.framework.graph import StageSpec
    from tasks.framework.results import StageResult
    from tasks.framework.workdir import open_workdir

    wd = open_workdir(config)
    ours = {spec.name for spec in graph.pipeline(config)}
    others = {spec.name for stages in graph.PIPELINES.values() for spec in stages} - ours
    if any(wd.exists(name) for name in sorted(others)):  # its register would be replaced
        raise ConfigError(
            "name",
            f"{redact_uri(config.workdir)} holds another pipeline's stages: give the import "
            f"a run of its own, e.g. --set name={config.name}-fairseq",
        )

    def run_one(stage: StageSpec, rerun: bool | str, parent: str) -> StageResult:
        result = runner.tracked_stage(config, stage.name, force=rerun, workdir=wd, parent=parent)
        ran = "ran" if result.ran else "up to date, skipped"
        print(f"{result.stage}: {ran} ({result.reason}) -> {runner.place(config, stage.name, wd)}")
        if "warning" in result.stats:
            print(f"{result.stage}: warning: {result.stats['warning']}")
        return result

    forced = ours if args.force else set()
    results, _ = runner.run_pipeline(config, run_one, force=forced, follow_upstream=False)
    stats = results[-1].stats  # the last stage's: register's
    print(
        f"registered: {stats['name']} version {stats['version']} "
        f"(aliases: {', '.join(stats['aliases'])}; {stats['decision']})"
    )
    return 0


def cmd_deploy(args: argparse.Namespace) -> int:
    config = _load(args, args.config, args.set)
    _ = config.store  # its runs will open it: a URI or credentials that cannot work, now
    from pipelines.deploy import deploy

    deploy(
        Path(args.config).resolve(),
        config,
        cron=args.cron,
        work_pool=args.work_pool,
        stage=args.stage,
        overrides=_overrides(args.set),
    )
    return 0


def cmd_ui(args: argparse.Namespace) -> int:
    config = _load(args, args.config, args.set) if args.config else None
    tracking = config.tracking_uri if config else "sqlite:///mlflow.db"
    mlflow_cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "ui",
        "--backend-store-uri",
        tracking,
        "--host",
        args.host,
        "--port",
        str(args.mlflow_port),
    ]
    prefect_cmd = [
        sys.executable,
        "-m",
        "prefect",
        "server",
        "start",
        "--host",
        args.host,
        "--port",
        str(args.prefect_port),
    ]
    if not args.start:
        print("MLflow:  " + " ".join(map(redact_uri, mlflow_cmd)))
        print("Prefect: " + " ".join(prefect_cmd))
        print(
            f"then open http://{args.host}:{args.mlflow_port} and http://{args.host}:{args.prefect_port}"
        )
        return 0
    import subprocess

    procs = [subprocess.Popen(mlflow_cmd), subprocess.Popen(prefect_cmd)]
    print(
        f"MLflow on http://{args.host}:{args.mlflow_port},"
        f" Prefect on http://{args.host}:{args.prefect_port}; Ctrl-C stops both"
    )
    try:
        for p in procs:
            p.wait()
    except KeyboardInterrupt:
        for p in procs:
            p.terminate()
    return 0
