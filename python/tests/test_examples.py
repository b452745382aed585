"""The examples docs/python.md quotes run (on a generated scan and a tiny checkpoint)."""
import os
import subprocess
import sys

from helpers import write_model
from scans import box_on_belt, write_ply

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")


def run(example, *args):
    out = subprocess.run([sys.executable, os.path.join(EXAMPLES, example), *map(str, args)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_measure_scan_example(tmp_path):
    write_ply(tmp_path / "scan.ply", box_on_belt())
    out = run("measure_scan.py", tmp_path / "scan.ply")
    assert "604 x 405 x 249 mm, ok []" in out and "appendage points" in out


def test_gradients_example(tmp_path):
    write_model(tmp_path)
    out = run("gradients.py", tmp_path)
    assert "sft loss" in out and "grpo loss" in out and "(40, 24)" in out
