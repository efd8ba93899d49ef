#!/usr/bin/env python3
"""Live curves of a ditrl run in TensorBoard and Weights & Biases, from its files.

    ~/.cache/ditrl/venv/bin/python tools/follow.py runs/x --tensorboard tb/x [--wandb [DIR]]
        [--once] [--interval 30]

Follows RUN_DIR/metrics.h5 while the job trains: every --interval seconds the rows
written since the last poll become TensorBoard scalars (event files under
--tensorboard DIR) and/or rows of a Weights & Biases offline run (under --wandb DIR,
default the TensorBoard DIR; upload it later with `wandb sync DIR/wandb`). The
sample grids the run lists in RUN_DIR/samples/index.jsonl become images at their
rollout, captioned with their prompts and rewards (an animated WebP by its first
frame; a file PIL cannot read, such as an MP4, is skipped with a note). It stops
once the run has ended (OUT/status says complete or preempted and no job started
since, or the job named in OUT/.lock is gone from this host: `ditrl status`'s
states); --once converts what is there and exits.

metrics.h5 is never opened in place: HDF5 readers lock the file and the writer's
next row would then fail. Its bytes are copied while their size and time stay the
same and read from memory, as `ditrl status` does; a copy caught mid-write is
taken again at the next poll. Rerunning is idempotent: DIR/.ditrl_follow.json keeps
the last step written per series and the last sample rollout, so points are never
written twice. A NaN in metrics.h5 means the metric is absent from that row
(io/metrics.hpp) and is not written; infinities are.

Exit status: 0 done, 2 bad usage or RUN_DIR is not a run with metrics.h5.
"""
import argparse
import io
import json
import os
import re
import socket
import sys
import time
import tomllib
import uuid

import h5py
import numpy as np

STATE_FILE = ".ditrl_follow.json"
LAST_TRIES = 10  # reads of metrics.h5 no job writes any more (or --once) before it is called unreadable
RETRY_SECONDS = 0.2
RUN_ENTRIES = ("metrics.h5", "metrics.h5.damaged", "status", "checkpoints", "logs", ".lock")


class UsageError(Exception):
    pass


# ---------------------------------------------------------------- reading the run


def stable_bytes(path):
    """The file's bytes, or None when a write changed its size or time meanwhile."""
    before = os.stat(path)
    with open(path, "rb") as f:
        data = f.read()
    after = os.stat(path)
    if (before.st_size, before.st_mtime_ns) != (after.st_size, after.st_mtime_ns):
        return None
    return data


def read_metrics(path):
    """(steps, {series: values}, root attributes) from a consistent copy, or (None, why not).

    A copy caught between the writer's updates (or a file just moved aside) does not
    parse, lacks /metrics/step or has series of unequal lengths: the next poll reads it again."""
    try:
        data = stable_bytes(path)
        if data is None:
            return None, "its size or time changed while it was copied"
        with h5py.File(io.BytesIO(data), "r") as f:
            if "metrics/step" not in f:
                return None, "not a ditrl metrics file (no /metrics/step)"
            series = {}
            f["metrics"].visititems(
                lambda name, obj: series.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None
            )
            attrs = {k: (v.decode() if isinstance(v, bytes) else str(v)) for k, v in f.attrs.items()}
    except (OSError, KeyError, ValueError, RuntimeError) as e:
        return None, f"not readable as HDF5 ({e})"
    steps = series.pop("step")
    if any(len(values) != len(steps) for values in series.values()):
        return None, "series of unequal lengths (a row half written)"
    return (steps, series, attrs), None


def read_samples(run_dir):
    """The grids RUN_DIR/samples/index.jsonl lists (a line still being written is left for later)."""
    path = os.path.join(run_dir, "samples", "index.jsonl")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return []
    samples = []
    lines = text.split("\n")[:-1]  # the text after the last newline is not a whole line yet
    for number, line in enumerate(lines, 1):
        try:
            entry = json.loads(line)
            entry["path"] = os.path.join(run_dir, "samples", entry["file"])
            entry["rollout"] = int(entry["rollout"])
        except (ValueError, KeyError, TypeError) as e:
            if line.strip():
                print(f"follow: {path}:{number}: skipped, not a sample line ({e})", file=sys.stderr)
            continue
        samples.append(entry)
    return samples


def grid_png(path):
    """(png bytes, height, width) of a grid; an animated WebP gives its first frame."""
    from PIL import Image

    with Image.open(path) as image:
        image.seek(0)
        rgb = image.convert("RGB")
        out = io.BytesIO()
        rgb.save(out, format="PNG")
        return out.getvalue(), rgb.height, rgb.width


def caption(sample):
    """"rollout R" and a line per prompt with its reward."""
    rewards = sample.get("rewards", [])
    lines = [f"rollout {sample['rollout']}"]
    for i, prompt in enumerate(sample.get("prompts", [])):
        reward = rewards[i] if i < len(rewards) else None
        if isinstance(reward, (int, float)):
            prompt += f"  reward {reward:.4g}"
        lines.append(f"{i}: {prompt}")
    return "\n".join(lines)


def read_text(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except FileNotFoundError:
        return ""


def holder_alive_here(lock_text):
    """Whether the job OUT/.lock names is a live ditrl process of this host (None: another host)."""
    m = re.match(r"host (.+), PID (\d+),", lock_text)
    if not m:
        return False
    if m.group(1) != socket.gethostname():
        return None
    try:
        with open(f"/proc/{m.group(2)}/cmdline", "rb") as f:
            return b"ditrl" in f.read()
    except OSError:
        return False


def run_ended(run_dir):
    """Whether no job trains in RUN_DIR any more: `ditrl status`'s complete, preempted or stopped.

    A job on another host cannot be seen from here: it counts as running until it
    writes OUT/status."""
    lock = os.path.join(run_dir, ".lock")
    status = os.path.join(run_dir, "status")
    if not os.path.exists(lock):
        return bool(read_text(status))
    alive = holder_alive_here(read_text(lock))
    if alive:
        return False
    newer_job = not read_text(status) or os.path.getmtime(lock) > os.path.getmtime(status)
    if not newer_job:
        return True
    return alive is False


# ---------------------------------------------------------------- the sinks


class TensorBoardSink:
    """Event files: each metric a float64 scalar (exact), each grid an image and its caption a text."""

    def __init__(self, logdir):
        from tensorboard.compat.proto import summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.pb = summary_pb2
        self.writer = EventFileWriter(logdir)
        plugin = summary_pb2.SummaryMetadata.PluginData
        self.scalar_meta = summary_pb2.SummaryMetadata(plugin_data=plugin(plugin_name="scalars"))
        self.text_meta = summary_pb2.SummaryMetadata(plugin_data=plugin(plugin_name="text"))
        self.described = set()  # the tags this event file has given their metadata

    def add(self, step, values):
        from tensorboard.compat.proto import tensor_pb2, types_pb2

        summary = self.pb.Summary()
        for name, value in values.items():
            tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_DOUBLE, double_val=[value])
            value = summary.value.add(tag=name, tensor=tensor)
            if name not in self.described:  # TensorBoard takes a tag's plugin from its first event
                value.metadata.CopyFrom(self.scalar_meta)
                self.described.add(name)
        self._write(step, summary)

    def add_grid(self, sample, png, height, width):
        from tensorboard.compat.proto import tensor_pb2, tensor_shape_pb2, types_pb2

        summary = self.pb.Summary()
        image = self.pb.Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=png)
        summary.value.add(tag="samples/grid", image=image)
        text = tensor_pb2.TensorProto(
            dtype=types_pb2.DT_STRING,
            string_val=[caption(sample).encode()],
            tensor_shape=tensor_shape_pb2.TensorShapeProto(),
        )
        summary.value.add(tag="samples/caption", tensor=text, metadata=self.text_meta)
        self._write(sample["rollout"], summary)

    def _write(self, step, summary):
        from tensorboard.compat.proto import event_pb2

        self.writer.add_event(event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary))

    def flush(self):
        self.writer.flush()

    def close(self):
        self.writer.close()


class WandbSink:
    """A Weights & Biases offline run: rows against `optimizer_step`, grids against `rollout_id`.

    Opened at the first row or grid, so a rerun with nothing new leaves no run behind;
    one with new points resumes the same run id in a new offline directory, which
    `wandb sync` uploads after the earlier ones (in order of start time)."""

    def __init__(self, directory, state, name, config):
        os.environ["WANDB_MODE"] = "offline"
        import wandb

        self.wandb, self.directory, self.state, self.name, self.config = wandb, directory, state, name, config
        self.run = None
        self.groups = set()

    def _opened(self, names):
        if self.run is None:
            self.state.setdefault("wandb_id", uuid.uuid4().hex[:8])
            # No console capture, system metrics or git probing: the run holds what metrics.h5 holds.
            # wandb names an offline run's folder by its start second and the run id: a pass that
            # resumed the id within the second of the previous one would write into that folder.
            started = self.state.get("wandb_started", 0.0)
            if int(time.time()) == int(started):
                time.sleep(int(started) + 1 - time.time())
            self.state["wandb_started"] = time.time()
            settings = self.wandb.Settings(
                mode="offline", console="off", x_disable_stats=True, save_code=False, disable_git=True, silent=True
            )
            self.run = self.wandb.init(
                dir=self.directory,
                id=self.state["wandb_id"],
                resume="allow",
                project=os.environ.get("WANDB_PROJECT", "ditrl"),
                name=self.name,
                config=self.config,
                settings=settings,
            )
            self.run.define_metric("optimizer_step")
            self.run.define_metric("rollout_id")
            self.run.define_metric("samples/*", step_metric="rollout_id")
        # Per group, not "*": a glob over everything would stamp the grids with an optimizer step too.
        for group in {name.split("/")[0] + "/*" if "/" in name else name for name in names} - self.groups:
            self.run.define_metric(group, step_metric="optimizer_step")
            self.groups.add(group)
        return self.run

    def add(self, step, values):
        self._opened(values).log({"optimizer_step": int(step), **values})

    def add_grid(self, sample, png, height, width):
        from PIL import Image

        grid = self.wandb.Image(Image.open(io.BytesIO(png)), caption=caption(sample))
        self._opened([]).log({"rollout_id": int(sample["rollout"]), "samples/grid": grid})

    def flush(self):
        pass

    def close(self):
        if self.run is not None:
            self.run.finish()

    @property
    def run_dir(self):
        return self.run.dir if self.run is not None else None


# ---------------------------------------------------------------- following


class StateFile:
    """DIR/.ditrl_follow.json: what each sink writing into DIR has been given."""

    def __init__(self, directory):
        self.path = os.path.join(directory, STATE_FILE)
        try:
            with open(self.path, encoding="utf-8") as f:
                self.data = json.load(f)
        except FileNotFoundError:
            self.data = {}

    def save(self):
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.data, f, indent=1, sort_keys=True)
        os.replace(tmp, self.path)


class Target:
    """One sink and its part of the state file."""

    def __init__(self, sink, state_file, state):
        self.sink, self.state_file, self.state = sink, state_file, state
        state.setdefault("last_step", {})
        state.setdefault("last_sample_rollout", -1)

    def write_rows(self, steps, series):
        last = self.state["last_step"]
        written = 0
        # Steps only grow within a file (a resume drops the rows it recomputes): skip the rows all series have.
        first = int(np.searchsorted(steps, min((last.get(name, -1) for name in series), default=-1), side="right"))
        for row in range(first, len(steps)):
            step = steps[row]
            values = {
                name: float(v[row])
                for name, v in series.items()
                if step > last.get(name, -1) and not np.isnan(v[row])
            }
            if values:
                self.sink.add(int(step), values)
                written += 1
        for name in series:
            if len(steps):
                last[name] = max(last.get(name, -1), int(steps[-1]))
        return written

    def write_samples(self, samples):
        written = 0
        for sample in sorted(samples, key=lambda s: s["rollout"]):
            if sample["rollout"] <= self.state["last_sample_rollout"]:
                continue
            if not os.path.exists(sample["path"]):
                break  # listed before its file is in place: the next poll takes it
            try:
                png, height, width = grid_png(sample["path"])
            except (OSError, ValueError) as e:
                print(f"follow: {sample['path']}: skipped, not readable as an image ({e})", file=sys.stderr)
            else:
                self.sink.add_grid(sample, png, height, width)
                written += 1
            self.state["last_sample_rollout"] = sample["rollout"]
        return written

    def commit(self):
        self.sink.flush()
        self.state_file.save()


def check_run_dir(run_dir):
    if not os.path.isdir(run_dir):
        raise UsageError(f"{run_dir}: no such folder (give a run's run.out_dir)")
    if not any(os.path.exists(os.path.join(run_dir, e)) for e in RUN_ENTRIES):
        raise UsageError(
            f"{run_dir}: not a ditrl run folder: it holds none of metrics.h5, status, checkpoints/, logs/ or .lock"
        )


def run_identity(attrs):
    """The W&B run's name and config: the deck the run stored, and its build."""
    config = {k: attrs[k] for k in ("ditrl_version", "ditrl_commit", "cpu") if k in attrs}
    name = None
    try:
        deck = tomllib.loads(attrs.get("deck", ""))
        config["deck"] = deck
        name = deck.get("run", {}).get("name")
    except tomllib.TOMLDecodeError:
        pass
    return name, config


def open_targets(args, table):
    targets = []
    files = {}

    def state_of(directory, kind):
        os.makedirs(directory, exist_ok=True)
        state_file = files.setdefault(os.path.realpath(directory), StateFile(directory))
        return state_file, state_file.data.setdefault(kind, {})

    if args.tensorboard:
        state_file, state = state_of(args.tensorboard, "tensorboard")
        targets.append(Target(TensorBoardSink(args.tensorboard), state_file, state))
    if args.wandb is not None:
        directory = args.wandb or args.tensorboard
        state_file, state = state_of(directory, "wandb")
        name, config = run_identity(table[2])
        targets.append(Target(WandbSink(directory, state, name, config), state_file, state))
    return targets


def read_run_metrics(args):
    """(table, why not): metrics.h5 of RUN_DIR, or why it could not be read now."""
    metrics = os.path.join(args.run_dir, "metrics.h5")
    if not os.path.exists(metrics):
        return None, "no such file (the run has written no metrics)"
    return read_metrics(metrics)


def poll(args, targets):
    """One pass: (why metrics.h5 was not read or None, rows written, grids written)."""
    table, why_not = read_run_metrics(args)
    rows = grids = 0
    samples = read_samples(args.run_dir)
    for t in targets:
        if table:
            rows = t.write_rows(table[0], table[1])
        grids = t.write_samples(samples)
        t.commit()
    return why_not, rows, grids


class Pacer:
    """The wait before the next read: --interval while a job writes; a few quick tries, then an
    error naming the file, once none does (--once, or the run has ended) and it still cannot be read."""

    def __init__(self, args):
        self.args, self.tries = args, 0

    def wait(self, ended, why_not):
        if ended:
            self.tries += 1
            if self.tries == LAST_TRIES:
                raise UsageError(f"{os.path.join(self.args.run_dir, 'metrics.h5')}: {why_not}")
        time.sleep(RETRY_SECONDS if ended else self.args.interval)


def first_table(args):
    """The run's metrics, waited for while a job may still write its first rows."""
    pacer = Pacer(args)
    while True:
        ended = args.once or run_ended(args.run_dir)
        table, why_not = read_run_metrics(args)
        if table:
            return table
        pacer.wait(ended, why_not)


def follow(args):
    check_run_dir(args.run_dir)
    targets = open_targets(args, first_table(args))
    pacer = Pacer(args)
    try:
        while True:
            ended = args.once or run_ended(args.run_dir)  # before the read: it then holds the job's last rows
            why_not, rows, grids = poll(args, targets)
            unread = f" (metrics.h5 not read this time: {why_not})" if why_not else ""
            print(f"follow: {rows} new row(s), {grids} new grid(s){unread}", flush=True)
            if ended and not why_not:
                break
            pacer.wait(ended, why_not)
    finally:
        for t in targets:
            t.sink.close()
    for t in targets:
        if isinstance(t.sink, WandbSink) and t.sink.run_dir:
            offline_run = os.path.dirname(t.sink.run_dir)
            print(f"follow: W&B offline run {offline_run}; upload it with `wandb sync {os.path.dirname(offline_run)}`")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="the run's folder (run.out_dir)")
    parser.add_argument("--tensorboard", metavar="DIR", help="write TensorBoard event files into DIR")
    parser.add_argument(
        "--wandb",
        metavar="DIR",
        nargs="?",
        const="",
        help="write a W&B offline run under DIR/wandb (DIR: --tensorboard's when not given)",
    )
    parser.add_argument("--once", action="store_true", help="convert what is there now and exit")
    parser.add_argument("--interval", type=float, default=30.0, metavar="S", help="seconds between polls (default 30)")
    args = parser.parse_args()
    if not args.tensorboard and not args.wandb:
        parser.error("give --tensorboard DIR and/or --wandb DIR")
    try:
        follow(args)
    except UsageError as e:
        print(f"follow: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
