"""The markdown section the single-kernel benchmarks (flash_backward.py, fp32_gemm.py) append to their results
file: title, command, machine, load and torch lines, then the table. fsdp_step.py takes cpu_name too."""

import datetime
import os
import platform
import sys

import torch


def cpu_name():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def cpu_words(prefixes):
    """The /proc/cpuinfo vendor and flag words that start with one of `prefixes`."""
    with open("/proc/cpuinfo") as f:
        return sorted({w for line in f if line.startswith(("flags", "vendor_id"))
                       for w in line.split() if w.startswith(prefixes)})


class Section:
    """Started before the measurements, so the date and the first load average are the run's own."""

    def __init__(self, title):
        self.start = datetime.datetime.now(datetime.timezone.utc)
        self.load_start = os.getloadavg()[0]
        self.title = title

    def write(self, out, cpu_prefixes, torch_line, header, rows):
        columns = header.count("|") - 1
        lines = [
            f"## {self.title}, {self.start:%Y-%m-%d %H:%M} UTC",
            "",
            f"- Command: `{' '.join([os.path.relpath(sys.argv[0])] + sys.argv[1:])}`",
            f"- Machine: {cpu_name()} ({', '.join(cpu_words(cpu_prefixes))}), {os.cpu_count()} hardware threads; "
            f"1-minute load average {self.load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end; 1 thread",
            f"- torch {torch.__version__} (the LibTorch ditrl links); {torch_line}",
            "",
            header,
            "|" + "---|" * columns,
            *rows,
            "",
        ]
        text = "\n".join(lines)
        if out:
            with open(out, "a") as f:
                f.write("\n" + text)
        print(text)
