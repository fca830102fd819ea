"""The fault campaign of issue 42 against what came after the first one: elastic2d, poisson2d,
implicit heat2d, ODE `events:` (terminal events, event-time data), `device: cuda` on a machine
without a GPU, `odecli init` outputs. Not run by pytest (hundreds of subprocesses); rerun with

    PYTHONPATH=$PWD python tests/fault_campaign/campaign.py specs|runs|signals|ranks [--limit N]

Each run is a subprocess under a 30 s (60 s for runs) timeout. A finding is any of: exit code
outside the expected set, a traceback, "internal error", an exit 2 without an `error: ` line, a
hang, an output or temporary left behind by a failed run. Findings are printed as they come and
summarised per category at the end; docs/faults.md holds the last summary.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
PYTHON = sys.executable
MPIEXEC = str(Path(sys.executable).parent / "mpiexec")
BASES = ["elastic-anomaly", "darcy-permeability-mlp", "heat-implicit", "bouncing-ball",
         "projectile-landing-fit", "vdp-fit-from-file", "acoustic-anomaly"]
HUGE_INT = 10**400

# (label, value or callable(workdir) -> value)
MUTATIONS: list[tuple[str, object]] = [
    ("null", None), ("true", True), ("string", "abc"), ("negative", -1), ("zero", 0), ("huge", 1e308),
    ("huge-int", HUGE_INT), ("nan", float("nan")), ("inf", float("inf")), ("-inf", float("-inf")),
    ("empty-list", []), ("empty-map", {}), ("ragged", [[1, 2], [3]]), ("list-of-strings", ["a", "b"]),
    ("tiny", 1e-300), ("big-int", 10**12), ("dev-zero", "/dev/zero"), ("directory", "adir"),
    ("fifo", "afifo"), ("missing-file", "nothere.h5"), ("non-utf8", "\udcff\udcfe"),
    ("cuda", "cuda"), ("nested", [[[[1.0]]]]),
]


def leaf_paths(node, prefix=()):
    """Every path to a value in a spec (mappings and lists), the containers included."""
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from leaf_paths(value, prefix + (key,))
    elif isinstance(node, list):
        for index, value in enumerate(node[:3]):
            yield from leaf_paths(value, prefix + (index,))


def mutate(spec, path, value, delete=False):
    spec = copy.deepcopy(spec)
    node = spec
    for key in path[:-1]:
        node = node[key]
    if delete:
        if isinstance(node, dict):
            node.pop(path[-1], None)
        else:
            del node[path[-1]]
    else:
        node[path[-1]] = value
    return spec


def dump(spec) -> bytes:
    text = yaml.safe_dump(spec, allow_unicode=True, sort_keys=False)
    return text.encode("utf-8", "surrogateescape")


def workdir() -> Path:
    """A copy of examples/ (specs refer to files beside them) with a folder and a FIFO."""
    folder = Path(tempfile.mkdtemp(prefix="odecli-campaign-"))
    for item in EXAMPLES.iterdir():
        if item.is_file():
            shutil.copy(item, folder / item.name)
    (folder / "adir").mkdir()
    os.mkfifo(folder / "afifo")
    return folder


def run(args, cwd, timeout=30, env=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    start = time.monotonic()
    try:
        done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, timeout=timeout)
        return done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace"), time.monotonic() - start
    except subprocess.TimeoutExpired as exc:
        return "timeout", "", (exc.stderr or b"").decode(errors="replace"), timeout


def judge(rc, out, err, allowed=(0, 2, 3)) -> str | None:
    """Why this outcome is a finding, or None."""
    if rc == "timeout":
        return "hang (timeout)"
    text = out + err
    for sign in ("Traceback", "internal error", "Exception ignored", "Segmentation"):
        if sign in text:
            return f"{sign}: {_last_line(text)}"
    if rc not in allowed:
        return f"rc {rc}: {_last_line(text)}"
    if rc == 2 and not any(line.startswith(("error: ", "[rank")) for line in err.splitlines()):
        return f"rc 2 without an error line: {_last_line(text)}"
    return None


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else "(no output)"


def leftovers(folder: Path, before: set[str]) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name not in before)


class Tally:
    def __init__(self) -> None:
        self.runs = Counter()
        self.findings: dict[str, list[str]] = {}

    def add(self, category: str, case: str, finding: str | None) -> None:
        self.runs[category] += 1
        if finding:
            self.findings.setdefault(category, []).append(f"{case}: {finding}")
            print(f"FINDING [{category}] {case}: {finding}", flush=True)

    def summary(self) -> str:
        lines = []
        for category, count in self.runs.items():
            found = self.findings.get(category, [])
            lines.append(f"{category}: {count} runs, {len(found)} findings")
            kinds = Counter(f.split(": ", 1)[1][:120] for f in found)
            for kind, n in kinds.most_common(15):
                lines.append(f"    {n} x {kind}")
        return "\n".join(lines)


def command_for(name: str, spec: dict) -> list[str]:
    if spec.get("kind") == "ode" and not isinstance(spec.get("inverse"), dict):
        return ["solve", f"{name}.yaml", "-o", "out.h5", "-q"]
    return ["train-inverse", f"{name}.yaml", "-o", "out.h5", "-q", "--iterations", "1"]


def campaign_specs(tally: Tally, limit: int, execute: bool, seed: int) -> None:
    """Every path of every base spec, with every mutation: validate, then (when it validates)
    the command itself, whose failure must then be a clean one with no output left."""
    folder = workdir()
    rng = random.Random(seed)
    cases = []
    for base in BASES:
        spec = yaml.safe_load((EXAMPLES / f"{base}.yaml").read_text())
        for path in list(leaf_paths(spec))[1:]:
            for label, value in MUTATIONS:
                cases.append((base, spec, path, label, value, False))
            cases.append((base, spec, path, "deleted", None, True))
        cases.append((base, spec, ("unknown_key",), "unknown-key", 1, False))
        for section in ("solver", "compute"):
            cases.append((base, spec, (section, "device"), "device-cuda", "cuda", False))
    rng.shuffle(cases)
    for base, spec, path, label, value, delete in cases[:limit]:
        try:
            mutated = mutate(spec, path, value, delete)
        except (KeyError, IndexError, TypeError):
            continue
        name = f"m-{base}"
        (folder / f"{name}.yaml").write_bytes(dump(mutated))
        case = f"{base} {'.'.join(map(str, path))}={label}"
        rc, out, err, _ = run([PYTHON, "-m", "odecli", "validate", f"{name}.yaml"], folder)
        tally.add("specs: validate", case, judge(rc, out, err, allowed=(0, 2)))
        if execute and rc == 0:
            before = {p.name for p in folder.iterdir()} - {"out.h5"}
            (folder / "out.h5").unlink(missing_ok=True)
            rc, out, err, _ = run([PYTHON, "-m", "odecli", *command_for(name, mutated)], folder, timeout=60)
            finding = judge(rc, out, err)
            left = [p for p in leftovers(folder, before) if p != "out.h5" or rc not in (0, 3)]
            if finding is None and left:
                finding = f"left behind after rc {rc}: {left}"
            for p in leftovers(folder, before):
                if p != "out.h5":
                    (folder / p).unlink()
            tally.add("specs: run after validate passed", case, finding)
    shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("category", choices=["specs", "runs", "signals", "ranks", "init"])
    parser.add_argument("--limit", type=int, default=400)
    parser.add_argument("--no-execute", action="store_true")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    tally = Tally()
    if args.category == "specs":
        campaign_specs(tally, args.limit, not args.no_execute, args.seed)
    else:
        CATEGORIES[args.category](tally, args.limit, args.seed)
    print(tally.summary())


CATEGORIES = {}

if __name__ == "__main__":
    main()
