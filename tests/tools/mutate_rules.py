"""Mutate one engine rule at a time in a copy of kvsim; count the golden, equality and vector tests that fail.

Usage (from the repository root): python tests/tools/mutate_rules.py [NAME-SUBSTRING ...]
Each rule must fail tests on both paths (skip-ahead and step-by-step); see docs/architecture.md.
"""
import shutil, subprocess, sys, os, tempfile
REPO = str(__import__("pathlib").Path(__file__).resolve().parents[2])
MUTATIONS = {
    "S2 one slot kept for the sampled token": ("kvsim/sched/chunked.py",
        "cap = self.config.max_model_len - computed - 1",
        "cap = self.config.max_model_len - computed"),
    "S3 a step that preempted admits nothing": ("kvsim/sched/chunked.py",
        "        if not plan.preempted:\n            # S3", "        if True:\n            # S3"),
    "S4 head-of-line blocking": ("kvsim/sched/chunked.py",
        "                break                               # TV10: head-of-line blocking",
        "                skipped.append(self.waiting.pop()); continue"),
    "TV9 max_num_seqs caps running": ("kvsim/sched/chunked.py",
        "            if len(self.running) >= self.max_num_active_reqs:\n                break                               # TV9",
        "            if len(self.running) > self.max_num_active_reqs:\n                break                               # TV9"),
    "S2 the threshold cuts running chunks": ("kvsim/sched/chunked.py",
        "# num_tokens_with_spec - computed\n        if 0 < self._threshold < n:",
        "# num_tokens_with_spec - computed\n        if False:"),
    "A2 a revived hit costs a free block": ("kvsim/kv/manager.py",
        "        num_evictable = list(map(ref.__getitem__, new_computed_blocks)).count(0)",
        "        num_evictable = 0"),
    "P1 FCFS victim is the last running": ("kvsim/sched/chunked.py",
        "        return self.running[-1]", "        return self.running[0]"),
    "P2 preempted go to the queue front": ("kvsim/sched/chunked.py",
        "        self.waiting.prepend(req)\n        plan.preempted.append(req)",
        "        self.waiting.add(req)\n        plan.preempted.append(req)"),
    "H3 at most num_tokens - 1 tokens hit": ("kvsim/kv/manager.py",
        "max_blocks = (req.num_tokens - 1) // self.block_size", "max_blocks = req.num_tokens // self.block_size"),
    "A4 cache at schedule time up to computed + new": ("kvsim/kv/manager.py",
        "self._cache_full_blocks(req, blocks, min(filled, req.num_tokens))",
        "self._cache_full_blocks(req, blocks, min(num_computed, req.num_tokens))"),
    "B6 free tail block first": ("kvsim/kv/manager.py",
        "        if not blocks:\n            return\n        if self._any_forks",
        "        if not blocks:\n            return\n        blocks = blocks[::-1]\n        if self._any_forks"),
    "B7 unhashed blocks to the head": ("kvsim/kv/block_pool.py",
        "                if lifo and block_hash[b] is None:", "                if False:"),
    "P1 a decode run stops before a block runs out": ("kvsim/sched/chunked_runs.py",
        "return max_steps if beyond is None else min(max_steps, beyond[0] - 1)",
        "return max_steps if beyond is None else min(max_steps, beyond[0])"),
    "S3 a decode run stops before a running request caches the head's block": ("kvsim/sched/chunked_runs.py",
        "return max_steps if first is None else first - 1",
        "return max_steps if first is None else first"),
    "N4 threshold ignored when alone": ("kvsim/sched/chunked.py",
        "            if num_in_system <= 1:", "            if num_in_system <= 0:"),
    # Chunk runs (skip-ahead only): a prompt chunked while the others decode.
    "P1 a chunk run stops before a block runs out": ("kvsim/kv/chunk_runs.py",
        "        return lo\n", "        return lo + 1\n"),
    "S3 a chunk run's last chunk only when nothing waits": ("kvsim/sched/chunked_runs.py",
        "        if not waiting and (last > 1", "        if (last > 1"),
    "A1 a chunk's blocks come after its step's decodes": ("kvsim/kv/chunk_runs.py",
        "        end = step * n + n - 1", "        end = step * n - 1"),
}
TESTS = ["tests/test_oracle_traces.py", "tests/test_fast_path.py", "tests/test_kv_vectors.py",
         "tests/test_sched_vectors.py", "tests/test_connector.py"]
only = sys.argv[1:]
for name, (path, old, new) in MUTATIONS.items():
    if only and not any(o in name for o in only):
        continue
    tmp = tempfile.mkdtemp()
    shutil.copytree(f"{REPO}/kvsim", f"{tmp}/kvsim"); shutil.copytree(f"{REPO}/tests", f"{tmp}/tests")
    src = open(f"{tmp}/{path}").read()
    assert src.count(old) == 1, (name, src.count(old))
    open(f"{tmp}/{path}", "w").write(src.replace(old, new))
    res = {}
    for label, args in (("skip-ahead", ["tests/test_oracle_traces.py", "-k", "skip-ahead"]),
                        ("step-by-step", ["tests/test_oracle_traces.py", "-k", "step-by-step"]),
                        ("fast-vs-step", ["tests/test_fast_path.py"]),
                        ("vectors", ["tests/test_kv_vectors.py", "tests/test_sched_vectors.py"]),
                        ("chunk-runs", ["tests/test_chunk_runs.py", "tests/test_sched_knobs.py"])):
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                             cwd=tmp, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": tmp})
        last = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-200:]
        failed = last.split(" failed")[0].split()[-1] if " failed" in last else "0"
        res[label] = failed
    print(f"{name}: " + ", ".join(f"{k} {v} failed" for k, v in res.items()), flush=True)
    shutil.rmtree(tmp)
