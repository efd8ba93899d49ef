#!/usr/bin/env python3
"""tools/follow.py on a real quickstart run (tests/CMakeLists.txt, tools.follow.*).

    follow_test.py live|tensorboard|wandb|no_metrics|states DITRL MPIEXEC WORK SOURCE_DIR

live: a 6-rollout quickstart trains on one rank while follow.py polls it every
0.2 s; follow.py must write rows in more than one poll (rows appended after it
started) and end by itself once the job has ended. It leaves WORK/run (with two
sample grids written here: the samples/index.jsonl contract) and WORK/tb-live.
tensorboard: --once into a fresh DIR; TensorBoard's own data provider (what its
UI serves) must give every series of metrics.h5 at every step, values equal as
float64, the same for the live DIR, the grids' pixels and captions; a second
--once adds no event. wandb: the same through a W&B offline run, read back from
its .wandb file (SKIPPED where wandb cannot be imported). no_metrics: a run
folder without metrics.h5 is refused, exit 2, naming the file. states: follow.py's
end of a run on folders made for each of `ditrl status`'s states.
"""
import glob
import io
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import time

import h5py
import numpy as np

SKIP = 77
ROLLOUTS = 6


def fail(message):
    print(f"FAILED: {message}")
    sys.exit(1)


def follow_cmd(source, *args):
    return [sys.executable, os.path.join(source, "tools", "follow.py"), *args]


def read_metrics(path):
    with open(path, "rb") as f:
        data = f.read()
    with h5py.File(io.BytesIO(data), "r") as f:
        series = {}
        f["metrics"].visititems(
            lambda name, obj: series.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None
        )
    return series.pop("step"), series


def sample_pixels():
    """The two grids' pixels: a PNG of rollout 1 and the first frame of an animated WebP of rollout 3."""
    rng = np.random.default_rng(0)
    png = rng.integers(0, 256, (24, 40, 3), dtype=np.uint8)
    frames = [rng.integers(0, 256, (16, 16, 3), dtype=np.uint8) for _ in range(3)]
    return {1: png, 3: frames}


def write_samples(run):
    """The grids as the samples writer lists them (samples/index.jsonl): a PNG, an animated WebP, an
    MP4 (skipped with a note), then a half-written line."""
    from PIL import Image

    os.makedirs(os.path.join(run, "samples"), exist_ok=True)
    pixels = sample_pixels()
    Image.fromarray(pixels[1]).save(os.path.join(run, "samples", "rollout-000001.png"))
    frames = [Image.fromarray(f) for f in pixels[3]]
    webp = os.path.join(run, "samples", "rollout-000003.webp")
    frames[0].save(webp, save_all=True, append_images=frames[1:], lossless=True)
    lines = [
        {"rollout": 1, "file": "rollout-000001.png", "prompts": ["a red cube", "a blue sphere"],
         "rewards": [0.25, -1.5]},
        {"rollout": 3, "file": "rollout-000003.webp", "prompts": ["a cat"], "rewards": [2.0]},
        {"rollout": 4, "file": "rollout-000004.mp4", "prompts": ["a dog"], "rewards": [1.0]},  # PIL reads no MP4
    ]
    with open(os.path.join(run, "samples", "rollout-000004.mp4"), "wb") as f:
        f.write(b"\x00\x00\x00\x18ftypmp42 not a whole video")
    for line in lines:
        line["source"] = "latent_preview"
    with open(os.path.join(run, "samples", "index.jsonl"), "w") as f:
        f.write("".join(json.dumps(line) + "\n" for line in lines) + '{"rollout": 5, "fi')


def first_frames():
    pixels = sample_pixels()
    return {1: pixels[1], 3: pixels[3][0]}


# ---------------------------------------------------------------- live


def check_live(ditrl, mpiexec, work, source):
    run, tb = os.path.join(work, "run"), os.path.join(work, "tb-live")
    for path in (run, tb):
        shutil.rmtree(path, ignore_errors=True)
    os.makedirs(work, exist_ok=True)
    deck = os.path.join(source, "inputs", "quickstart.toml")
    train = subprocess.Popen(
        [*mpiexec.split(), "-np", "1", ditrl, "train", deck]
        + ["--set", f"run.out_dir={run}", "--max-rollouts", str(ROLLOUTS)],
        stdout=open(os.path.join(work, "train.log"), "w"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.time() + 60
    while not os.path.exists(os.path.join(run, "metrics.h5")):
        if time.time() > deadline or train.poll() is not None:
            fail(f"the training job wrote no {run}/metrics.h5 (see {work}/train.log)")
        time.sleep(0.05)
    follow = subprocess.Popen(
        follow_cmd(source, run, "--tensorboard", tb, "--interval", "0.2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    rc = train.wait()  # CTest's TIMEOUT bounds it
    try:
        output = follow.communicate(timeout=60)[0]  # it ends with the job, after one more poll
    except subprocess.TimeoutExpired:
        follow.kill()
        fail(f"follow.py still ran 60 s after the job ended: {follow.communicate()[0][-2000:]}")
    print(output)
    if rc != 0 or follow.returncode != 0:
        fail(f"train rc {rc}, follow rc {follow.returncode}")
    polls_with_rows = [line for line in output.splitlines() if re.match(r"follow: [1-9]\d* new row", line)]
    if len(polls_with_rows) < 2:
        fail(f"follow.py wrote rows in {len(polls_with_rows)} poll(s): it did not catch rows appended while it ran")
    steps, _ = read_metrics(os.path.join(run, "metrics.h5"))
    if len(steps) != ROLLOUTS:
        fail(f"metrics.h5 has {len(steps)} rows, expected {ROLLOUTS}")
    write_samples(run)
    print(f"live: follow.py wrote rows in {len(polls_with_rows)} polls and ended with the job")


# ---------------------------------------------------------------- tensorboard


def tensorboard_view(logdir):
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer

    multiplexer = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance={"scalars": 0, "images": 0, "text": 0})
    multiplexer.AddRunsFromDirectory(logdir)
    multiplexer.Reload()
    return data_provider.MultiplexerDataProvider(multiplexer, logdir), context.RequestContext()


def check_tensorboard_scalars(logdir, steps, series):
    provider, ctx = tensorboard_view(logdir)
    scalars = provider.read_scalars(ctx, experiment_id="", plugin_name="scalars", downsample=10**9)
    if list(scalars) != ["."]:
        fail(f"{logdir}: runs {list(scalars)}, expected the one run '.'")
    got = scalars["."]
    if set(got) != set(series):
        missing, extra = set(series) - set(got), set(got) - set(series)
        fail(f"{logdir}: tags differ from metrics.h5's series: missing {missing}, extra {extra}")
    points = 0
    for name, values in series.items():
        want = [(int(s), float(v)) for s, v in zip(steps, values) if not np.isnan(v)]
        have = [(d.step, d.value) for d in got[name]]
        if have != want:
            fail(f"{logdir}: {name}: {have} != metrics.h5's {want}")
        points += len(have)
    return points


def check_tensorboard_samples(logdir, pixels):
    from PIL import Image

    provider, ctx = tensorboard_view(logdir)
    sequences = provider.read_blob_sequences(ctx, experiment_id="", plugin_name="images", downsample=10**9)
    images = sequences["."]["samples/grid"]
    if [d.step for d in images] != sorted(pixels):
        fail(f"images at steps {[d.step for d in images]}, expected {sorted(pixels)}")
    for datum in images:
        png = provider.read_blob(ctx, blob_key=datum.values[2].blob_key)  # [width, height, image]
        if not np.array_equal(np.asarray(Image.open(io.BytesIO(png)).convert("RGB")), pixels[datum.step]):
            fail(f"the image at rollout {datum.step} differs from its grid file")
    texts = provider.read_tensors(ctx, experiment_id="", plugin_name="text", downsample=10**9)["."]["samples/caption"]
    captions = {d.step: d.numpy.item().decode() for d in texts}
    if "0: a red cube  reward 0.25" not in captions.get(1, "") or "1: a blue sphere  reward -1.5" not in captions[1]:
        fail(f"caption of rollout 1: {captions.get(1)!r}")
    if "0: a cat  reward 2" not in captions.get(3, ""):
        fail(f"caption of rollout 3: {captions.get(3)!r}")


def event_count(logdir):
    from tensorboard.backend.event_processing import event_file_loader

    files = glob.glob(os.path.join(logdir, "events.out.tfevents.*"))
    return sum(1 for path in files for _ in event_file_loader.EventFileLoader(path).Load())


def check_tensorboard(ditrl, mpiexec, work, source):
    run = os.path.join(work, "run")
    steps, series = read_metrics(os.path.join(run, "metrics.h5"))
    pixels = first_frames()
    live_points = check_tensorboard_scalars(os.path.join(work, "tb-live"), steps, series)
    tb = os.path.join(work, "tb-once")
    shutil.rmtree(tb, ignore_errors=True)
    once = subprocess.run(follow_cmd(source, run, "--tensorboard", tb, "--once"), capture_output=True, text=True)
    if once.returncode != 0 or "rollout-000004.mp4: skipped, not readable as an image" not in once.stderr:
        fail(f"follow.py --once: rc {once.returncode}, no note of the MP4 it skips: {once.stderr!r}")
    points = check_tensorboard_scalars(tb, steps, series)
    check_tensorboard_samples(tb, pixels)
    before = event_count(tb)
    again = subprocess.run(
        follow_cmd(source, run, "--tensorboard", tb, "--once"), check=True, capture_output=True, text=True
    )
    # +1: the file version event that opens the new event file
    if event_count(tb) != before + 1 or "0 new row(s), 0 new grid(s)" not in again.stdout:
        fail(f"a second --once wrote to {tb}: {before} events before, {event_count(tb)} after; {again.stdout!r}")
    check_tensorboard_scalars(tb, steps, series)
    print(
        f"tensorboard: {len(series)} series, {points} points equal to metrics.h5 (live: {live_points}), "
        "2 grids, rerun adds none"
    )


# ---------------------------------------------------------------- wandb


def wandb_records(path):
    """The records of a .wandb file: LevelDB's log format (32 KiB blocks of checksummed
    fragments) after a 7-byte W&B header, each record a wandb_internal_pb2.Record."""
    from wandb.proto import wandb_internal_pb2

    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b":W&B":
        fail(f"{path}: no W&B header")
    block, pos, pending, records = 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a fragment header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        fragment = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        pending = fragment if kind in (1, 2) else pending + fragment
        if kind in (1, 4):  # FULL, LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def wandb_history(run_dir):
    rows, images = [], []
    for record in wandb_records(glob.glob(os.path.join(run_dir, "run-*.wandb"))[0]):
        if record.WhichOneof("record_type") != "history":
            continue
        item = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
        (images if "samples/grid/_type" in item else rows).append(item)
    return rows, images


def first_rows_copy(run, part, rows):
    """PART: RUN's samples and a metrics.h5 of its first `rows` rows (the file as it was earlier)."""
    shutil.rmtree(part, ignore_errors=True)
    shutil.copytree(os.path.join(run, "samples"), os.path.join(part, "samples"))
    shutil.copy(os.path.join(run, "status"), part)
    steps, series = read_metrics(os.path.join(run, "metrics.h5"))
    with h5py.File(os.path.join(run, "metrics.h5"), "r") as src:
        attrs = dict(src.attrs)
    with h5py.File(os.path.join(part, "metrics.h5"), "w") as dst:
        dst.attrs.update(attrs)
        for name, values in [("step", steps), *series.items()]:
            dst.create_dataset(f"metrics/{name}", data=values[:rows])


def check_wandb_rows(rows, steps, series):
    if [r["optimizer_step"] for r in rows] != [int(s) for s in steps]:
        fail(f"W&B rows at steps {[r['optimizer_step'] for r in rows]}, metrics.h5 has {steps.tolist()}")
    for index, row in enumerate(rows):
        have = {k: v for k, v in row.items() if not k.startswith("_") and k != "optimizer_step"}
        want = {name: float(v[index]) for name, v in series.items() if not np.isnan(v[index])}
        if have != want:
            fail(f"W&B row of step {steps[index]}: {sorted(set(have.items()) ^ set(want.items()))[:6]} differ")


def check_wandb(ditrl, mpiexec, work, source):
    """A run followed in two passes (its first 3 rows, then all 6), then once more with nothing new."""
    try:
        import wandb
    except ImportError as e:
        print(f"SKIPPED: the wandb package cannot be imported ({e}); pip install -r scripts/requirements.txt")
        sys.exit(SKIP)
    from PIL import Image

    run, part, out = os.path.join(work, "run"), os.path.join(work, "run-first-rows"), os.path.join(work, "wandb-once")
    steps, series = read_metrics(os.path.join(run, "metrics.h5"))
    first_rows_copy(run, part, 3)
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run(follow_cmd(source, part, "--wandb", out, "--once"), check=True)
    shutil.copy(os.path.join(run, "metrics.h5"), os.path.join(part, "metrics.h5"))
    subprocess.run(follow_cmd(source, part, "--wandb", out, "--once"), check=True)
    runs = sorted(glob.glob(os.path.join(out, "wandb", "offline-run-*")))
    if len(runs) != 2 or len({r.split("-")[-1] for r in runs}) != 1:
        fail(f"{out}/wandb: {runs}, expected two offline runs of one run id (the second resumed)")
    (first, images), (second, more_images) = wandb_history(runs[0]), wandb_history(runs[1])
    check_wandb_rows(first, steps[:3], {name: v[:3] for name, v in series.items()})
    check_wandb_rows(second, steps[3:], {name: v[3:] for name, v in series.items()})
    got = [(i.get("rollout_id"), i.get("optimizer_step"), i["samples/grid/caption"].split("\n")[0]) for i in images]
    if got != [(1, None, "rollout 1"), (3, None, "rollout 3")] or more_images:
        fail(f"W&B sample images (rollout_id, optimizer_step, caption): {got}, then {more_images}")
    pixels = first_frames()
    for image, rollout in zip(images, (1, 3)):
        with Image.open(os.path.join(runs[0], "files", image["samples/grid/path"])) as f:
            if not np.array_equal(np.asarray(f.convert("RGB")), pixels[rollout]):
                fail(f"W&B image of rollout {rollout} differs from its grid file")
    subprocess.run(follow_cmd(source, part, "--wandb", out, "--once"), check=True)
    if sorted(glob.glob(os.path.join(out, "wandb", "offline-run-*"))) != runs:
        fail("a third --once with nothing new opened another offline run")
    print(f"wandb {wandb.__version__}: {len(steps)} rows x {len(series)} series equal to metrics.h5 over two passes")
    print("wandb: the second pass resumed the run id with the new rows only; a pass with nothing new opens no run")


# ---------------------------------------------------------------- no metrics


def check_no_metrics(ditrl, mpiexec, work, source):
    run = os.path.join(work, "no-metrics")
    shutil.rmtree(run, ignore_errors=True)
    os.makedirs(os.path.join(run, "logs"))
    with open(os.path.join(run, "status"), "w") as f:
        f.write("complete\n")
    tb = os.path.join(work, "tb-none")
    r = subprocess.run(follow_cmd(source, run, "--tensorboard", tb, "--once"), capture_output=True, text=True)
    if r.returncode != 2 or f"{run}/metrics.h5: no such file" not in r.stderr:
        fail(f"follow.py on a run without metrics.h5: rc {r.returncode}, {r.stderr!r}")
    nowhere = os.path.join(work, "nowhere")
    r = subprocess.run(follow_cmd(source, nowhere, "--tensorboard", tb), capture_output=True, text=True)
    if r.returncode != 2 or "no such folder" not in r.stderr:
        fail(f"follow.py on a missing folder: rc {r.returncode}, {r.stderr!r}")
    print("no_metrics: refused with exit 2, naming the file")


# ---------------------------------------------------------------- states


def check_states(ditrl, mpiexec, work, source):
    """follow.py's end of a run is `ditrl status`'s: each state on a folder made for it."""
    sys.path.insert(0, os.path.join(source, "tools"))
    import follow

    dead_pid = subprocess.Popen(["true"])
    dead_pid.wait()
    host = socket.gethostname()
    cases = [  # (status, .lock text, .lock newer than status, ended)
        ("", "", False, False),  # not started
        ("complete", "", False, True),
        ("preempted", f"host {host}, PID {dead_pid.pid}, since 2026-01-01 00:00:00 UTC", False, True),
        ("preempted", f"host {host}, PID {dead_pid.pid}, since 2026-01-01 00:00:00 UTC", True, True),  # stopped
        ("", f"host {host}, PID {dead_pid.pid}, since 2026-01-01 00:00:00 UTC", True, True),  # stopped
        ("", f"host {host}, PID {os.getpid()}, since 2026-01-01 00:00:00 UTC", True, False),  # running (a ditrl venv)
        ("complete", "host elsewhere-node, PID 1, since 2026-01-01 00:00:00 UTC", True, False),  # unknown: running
        ("complete", "host elsewhere-node, PID 1, since 2026-01-01 00:00:00 UTC", False, True),
    ]
    for i, (status, lock, lock_newer, ended) in enumerate(cases):
        run = os.path.join(work, "states", str(i))
        shutil.rmtree(run, ignore_errors=True)
        os.makedirs(run)
        files = [("status", status), (".lock", lock)] if lock_newer else [(".lock", lock), ("status", status)]
        for order, (name, text) in enumerate(files):  # the later one 1 s newer
            if text:
                with open(os.path.join(run, name), "w") as f:
                    f.write(text + "\n")
                os.utime(os.path.join(run, name), (1.8e9 + order, 1.8e9 + order))
        if follow.run_ended(run) != ended:
            fail(f"case {i} (status {status!r}, .lock {lock!r}, lock newer {lock_newer}): ended should be {ended}")
    print(f"states: {len(cases)} cases as `ditrl status` tells them")


if __name__ == "__main__":
    mode, ditrl, mpiexec, work, source = sys.argv[1:6]
    checks = {"live": check_live, "tensorboard": check_tensorboard, "wandb": check_wandb}
    checks.update(no_metrics=check_no_metrics, states=check_states)
    checks[mode](ditrl, mpiexec, work, source)
