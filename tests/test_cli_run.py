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


def _interrupted_inside_a_class_body():
    """What pydantic raises when Ctrl-C lands while a model class is built (a lazy import)."""
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt as exc:
        raise RuntimeError("Error calling __set_name__ on 'PydanticDescriptorProxy'") from exc


def test_interrupt_behind_finds_a_wrapped_ctrl_c():
    from kvsim.cli import interrupt_behind
    try:
        _interrupted_inside_a_class_body()
    except RuntimeError as exc:
        assert isinstance(interrupt_behind(exc), KeyboardInterrupt)
    assert interrupt_behind(RuntimeError("a real error")) is None
    try:
        try:
            raise ValueError("first")
        except ValueError as first:
            raise RuntimeError("second") from first
    except RuntimeError as exc:
        assert interrupt_behind(exc) is None


def test_interrupt_behind_finds_a_ctrl_c_inside_a_pydantic_schema_build():
    # Seen in tests/test_cli_faults.py (cluster-ctrl-c): SIGINT while pydantic-core built
    # kvsim.fleet.config's validators came back as a SchemaError whose text ends with it.
    from pydantic_core import SchemaError

    from kvsim.cli import interrupt_behind
    wrapped = SchemaError('Error building "tagged-union" validator:\n  KeyboardInterrupt: ')
    assert isinstance(interrupt_behind(wrapped), KeyboardInterrupt)
    assert interrupt_behind(SchemaError('Error building "model" validator: bad field')) is None


def test_a_ctrl_c_wrapped_by_a_lazy_import_ends_the_run_as_an_interrupt(monkeypatch, capsys, tmp_path):
    # Seen in tests/test_cli_faults.py (cluster-ctrl-c) when SIGINT arrived while
    # kvsim.fleet.config was being imported: a traceback instead of status 130.
    import importlib

    from kvsim.cli import main
    module = importlib.import_module("kvsim.scenario.simulate")   # the package exports the function

    def simulate(*_args, **_kwargs):
        _interrupted_inside_a_class_body()

    monkeypatch.setattr(module, "simulate", simulate)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    code = main(["run", str(path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 130
    assert "interrupted (Ctrl-C); no file was left half-written" in err
    assert "Traceback" not in err
    assert not list(tmp_path.glob("out/*"))              # nothing written


def test_the_command_list_imports_no_command_and_says_what_each_module_says():
    """``kvsim --help`` (or no command, or a typo) lists the commands with COMMANDS' one
    line each, importing none of their modules: the same text as the parser every
    command's module builds."""
    from kvsim.cli import build_parser

    code = ("import sys; from kvsim.cli import main; code = main(['--help']); "
            "print(sorted(m for m in sys.modules if m.startswith(('pandas', 'matplotlib', 'kvsim.'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    *text, imported = done.stdout.splitlines()
    assert imported == "['kvsim.cli', 'kvsim.native', 'kvsim.sim', 'kvsim.sim.gc_pause']"
    assert "\n".join(text) + "\n" == build_parser().format_help()
    typo = kvsim("bogus")
    assert typo.returncode == 2 and "invalid choice: 'bogus'" in typo.stderr


def test_the_command_runs_blas_on_one_thread_unless_the_environment_says_otherwise():
    """kvsim.cli sets OPENBLAS_NUM_THREADS=1 before numpy is imported (its threads
    only spin in kvsim), and leaves a value the user gave."""
    import os

    code = ("import os, sys; import kvsim.cli; import numpy; "
            "print(os.environ['OPENBLAS_NUM_THREADS'], len(os.listdir('/proc/self/task')))")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "1"]           # one thread: numpy started no others
    given = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=60, env={**env, "OPENBLAS_NUM_THREADS": "3"})
    assert given.returncode == 0, given.stderr
    assert given.stdout.split()[0] == "3"
