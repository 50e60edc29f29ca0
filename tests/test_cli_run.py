"""``kvsim run`` as a program: it exits without the interpreter's teardown, output intact."""

import json
import subprocess
import sys

import yaml

SCENARIO = {
    "name": "cli-run", "seed": 0, "model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm"},
    "engine": {"max_num_batched_tokens": 256, "max_model_len": 2048},
    "cost_model": {"type": "constant", "step_time_s": 0.01},
    "workload": {"num_requests": 20, "arrival": {"type": "poisson", "rate": 50.0},
                 "prompt_len": {"type": "fixed", "value": 100},
                 "output_len": {"type": "fixed", "value": 10}},
}


def kvsim(*argv):
    return subprocess.run([sys.executable, "-m", "kvsim", *argv], capture_output=True, text=True,
                          timeout=300)


def test_run_as_a_program_flushes_its_output_and_writes_every_file(tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    out = tmp_path / "out"
    done = kvsim("run", str(scenario), "--out", str(out), "--json", "--trace", str(tmp_path / "t.jsonl"))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["completed"] == 20          # stdout was flushed whole
    assert json.loads((out / "summary.json").read_text())["completed"] == 20
    assert len((out / "requests.csv").read_text().splitlines()) == 21
    assert (tmp_path / "t.jsonl").read_text().endswith("\n")


def test_a_failing_run_still_exits_with_status_2(tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump({**SCENARIO, "model": "no-such-model"}))
    done = kvsim("run", str(scenario))
    assert done.returncode == 2
    assert "no-such-model" in done.stderr
