"""The fault campaign of issue 42 against what came after the first one: elastic2d, poisson2d,
implicit heat2d, ODE `events:` (terminal events, event-time data), `device: cuda` on a machine
without a GPU, `odecli init` outputs. Not run by pytest (hundreds of subprocesses); rerun with

    PYTHONPATH=$PWD python tests/fault_campaign/campaign.py specs|runs|signals|ranks|h5signals [--limit N]

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
    parser.add_argument("category", choices=["specs", "runs", "signals", "ranks", "h5signals"])
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


# ---- damaged run files -------------------------------------------------------------------------

RUNS = {  # name: (command line in the work folder, exit codes it may end with)
    "elastic": (["train-inverse", "elastic-anomaly.yaml", "-o", "elastic.h5", "-q", "--iterations", "1"], (0,)),
    "poisson": (["train-inverse", "darcy-permeability-mlp.yaml", "-o", "poisson.h5", "-q", "--iterations", "1"], (0,)),
    "heat-implicit": (["train-inverse", "heat-implicit.yaml", "-o", "heat-implicit.h5", "-q", "--iterations", "1"], (0,)),
    "events": (["solve", "bouncing-ball.yaml", "-o", "events.h5", "-q"], (0, 3)),
    "event-fit": (["train-inverse", "projectile-landing-fit.yaml", "-o", "event-fit.h5", "-q", "--iterations", "2"], (0,)),
}
READERS = [["stats"], ["stats", "--json"], ["stats", "--per-sample"], ["export", "--csv", "csvout"],
           ["plot", "-o", "fig.png"]]


def make_runs(folder: Path) -> dict[str, Path]:
    made = {}
    for name, (args, codes) in RUNS.items():
        rc, out, err, took = run([PYTHON, "-m", "odecli", *args], folder, timeout=300)
        assert rc in codes, (name, rc, err)
        made[name] = folder / f"{name}.h5"
        print(f"made {name} run in {took:.1f} s", flush=True)
    return made


def _h5_items(path: Path) -> tuple[list[str], list[tuple[str, str]]]:
    import h5py

    datasets, attrs = [], []
    with h5py.File(path, "r") as h5:
        def visit(name, node):
            if isinstance(node, h5py.Dataset):
                datasets.append(name)
            for a in node.attrs:
                attrs.append((name, a))
        h5.visititems(visit)
        attrs += [("/", a) for a in h5.attrs]
    return datasets, attrs


def damages(path: Path, rng: random.Random):
    """(label, function(copy path)) for every kind of damage of the file at ``path``."""
    import h5py
    import numpy as np

    size = path.stat().st_size
    datasets, attrs = _h5_items(path)
    for fraction in (0.05, 0.3, 0.6, 0.9, 0.999):
        yield f"truncated to {fraction}", lambda p, f=fraction: os.truncate(p, int(size * f))
    for _ in range(12):
        offset = rng.randrange(size)
        def flip(p, offset=offset):
            with open(p, "r+b") as handle:
                handle.seek(offset)
                byte = handle.read(1)
                handle.seek(offset)
                handle.write(bytes([byte[0] ^ 0xFF]))
        yield f"byte {offset} flipped", flip

    def edit(change):
        def apply(p):
            with h5py.File(p, "a") as h5:
                change(h5)
        return apply

    for name in datasets:
        def as_group(h5, name=name):
            del h5[name]
            h5.create_group(name)
        def as_strings(h5, name=name):
            shape = h5[name].shape
            del h5[name]
            h5.create_dataset(name, data=np.full(shape or (), "x", dtype=h5py.string_dtype()))
        def as_nan(h5, name=name):
            d = h5[name]
            shape = d.shape
            del h5[name]
            h5.create_dataset(name, data=np.full(shape, np.nan))
        def as_int(h5, name=name):
            d = h5[name]
            shape = d.shape
            del h5[name]
            h5.create_dataset(name, data=np.full(shape, 7, dtype=np.int64))
        def reshaped(h5, name=name):
            del h5[name]
            h5.create_dataset(name, data=np.zeros((3, 1, 2)))
        def dangling(h5, name=name):
            del h5[name]
            h5[name] = h5py.SoftLink("/nowhere")
        def external(h5, name=name):
            del h5[name]
            h5[name] = h5py.ExternalLink("other.h5", "/x")
        def empty(h5, name=name):
            d = h5[name]
            dtype = d.dtype
            del h5[name]
            h5.create_dataset(name, shape=(0,), dtype=dtype)
        for label, change in (("group", as_group), ("strings", as_strings), ("nan", as_nan), ("int", as_int),
                              ("reshaped", reshaped), ("dangling link", dangling), ("external link", external),
                              ("empty", empty)):
            yield f"{name} as {label}", edit(change)
    for node, name in attrs:
        def deleted(h5, node=node, name=name):
            del h5[node].attrs[name]
        def nan(h5, node=node, name=name):
            h5[node].attrs[name] = np.nan
        def bad_text(h5, node=node, name=name):
            h5[node].attrs[name] = np.void(b"\xff\xfe")
        def strings(h5, node=node, name=name):
            h5[node].attrs[name] = "\u00e9\u00e9"
        def array(h5, node=node, name=name):
            h5[node].attrs[name] = np.zeros((2, 2))
        for label, change in (("deleted", deleted), ("nan", nan), ("opaque bytes", bad_text), ("text", strings),
                              ("2x2 array", array)):
            yield f"{node}@{name} {label}", edit(change)


def campaign_runs(tally: Tally, limit: int, seed: int) -> None:
    """Every damage of every new kind of run file, under stats, export and plot."""
    folder = workdir()
    made = make_runs(folder)
    rng = random.Random(seed)
    cases = []
    for name, path in made.items():
        for label, damage in damages(path, rng):
            cases.append((name, path, label, damage, rng.choice(READERS)))
    rng.shuffle(cases)
    print(f"{len(cases)} damaged-file cases, running {min(limit, len(cases))}", flush=True)
    for name, path, label, damage, reader in cases[:limit]:
        copy = folder / "damaged.h5"
        shutil.copy(path, copy)
        try:
            damage(copy)
        except Exception as exc:  # noqa: BLE001 - a damage h5py refuses to make is no case
            continue
        before = {p.name for p in folder.iterdir()}
        rc, out, err, _ = run([PYTHON, "-m", "odecli", reader[0], "damaged.h5", *reader[1:]], folder)
        finding = judge(rc, out, err, allowed=(0, 2))
        left = leftovers(folder, before)
        if finding is None and rc != 0 and left:
            finding = f"left behind after rc {rc}: {left}"
        for p in left:
            shutil.rmtree(folder / p) if (folder / p).is_dir() else (folder / p).unlink()
        tally.add(f"runs: {reader[0]}", f"{name} {label} ({' '.join(reader)})", finding)
    shutil.rmtree(folder, ignore_errors=True)


CATEGORIES["runs"] = campaign_runs


# ---- rank failures -----------------------------------------------------------------------------

def _small(name: str) -> str:
    """An example made small enough for many MPI runs (fewer steps, one iteration)."""
    text = (EXAMPLES / f"{name}.yaml").read_text()
    return (text.replace("steps: 300", "steps: 60").replace("steps: 40, scheme", "steps: 6, scheme")
            .replace("iterations: 40", "iterations: 1").replace("iterations: 25", "iterations: 1")
            .replace("iterations: 12", "iterations: 1"))


def _mpmd(parts, args, env=None, timeout=120):
    """``mpiexec -n N -wdir A ... : -n M -wdir B ...``; returns (rc, out, err)."""
    cmd = [MPIEXEC]
    for k, (n, wdir) in enumerate(parts):
        cmd += ([":"] if k else []) + ["-n", str(n), "-wdir", str(wdir), PYTHON, "-m", "odecli", *args]
    rc, out, err, _ = run(cmd, parts[0][1], timeout=timeout, env={"OMP_NUM_THREADS": "1", **(env or {})})
    return rc, out, err


def campaign_ranks(tally: Tally, limit: int, seed: int) -> None:
    """Failures one rank meets alone, on the equations added since the first campaign: no hang,
    the failing rank's line, the code one rank gives for the same cause."""
    import numpy as np

    base = workdir()
    cases = []
    for name in ("elastic-anomaly", "darcy-permeability-mlp", "heat-implicit"):
        (base / f"{name}.yaml").write_text(_small(name))
        args = ["train-inverse", f"{name}.yaml", "-o", "out.h5", "-q", "--force"]
        for ranks in (2, 4):
            for rank in (0, ranks - 1):
                cases.append((f"{name} injected error on rank {rank}/{ranks}", [(ranks, base)], args,
                              {"ODECLI_PDE_FAIL_RANK": str(rank)}, (1,)))
            # the spec only on the last rank's folder / the first ranks' folder
            cases.append((f"{name} spec missing on rank {ranks - 1}/{ranks}", "missing-spec", (name, ranks), None, (2,)))
        cases.append((f"{name} model file missing on one rank", "missing-model", (name, 2), None, (2,)))
    darcy = _small("darcy-permeability-mlp").replace("max_iterations: 200", "max_iterations: 2")
    (base / "darcy-cg.yaml").write_text(darcy)
    for ranks in (1, 2, 4):
        cases.append((f"poisson CG not converging on {ranks} ranks", [(ranks, base)],
                      ["train-inverse", "darcy-cg.yaml", "-o", "cg.h5", "-q", "--force"], None, None))
    (base / "raise_late.py").write_text(
        "import torch\n\ndef f(t, y, p):\n    if bool((p['g'] > 20).any()) and bool((t > 0.5).any()):\n"
        "        raise ValueError('the Jupiter sample fails')\n    return torch.stack([y[:, 1], -p['g'] * torch.ones_like(y[:, 0])], -1)\n")
    ball = (EXAMPLES / "bouncing-ball.yaml").read_text().replace(
        "params: {g: 9.81}", "params: {g: [9.81, 3.7, 24.8, 1.6, 9.81]}").replace(
        "  equations:\n    h: v\n    v: -g\n", "  python: raise_late.py:f\n")
    (base / "ball-raise.yaml").write_text(ball)
    for ranks in (1, 2, 4):
        cases.append((f"events python rhs raising on one sample, {ranks} ranks", [(ranks, base)],
                      ["solve", "ball-raise.yaml", "-o", "ball.h5", "-q", "--force"], None, None))
    codes: dict[str, set] = {}
    for label, parts, args, env, expected in cases[:limit]:
        if parts == "missing-spec":
            name, ranks = args
            a, b = base / "a", base / "b"
            for folder in (a, b):
                shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir()
            shutil.copy(base / f"{name}.yaml", a / "s.yaml")
            parts, args = [(ranks - 1, a), (1, b)], ["train-inverse", "s.yaml", "-o", "out.h5", "-q"]
        elif parts == "missing-model":
            name, ranks = args
            a, b = base / "a", base / "b"
            for folder in (a, b):
                shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir()
            text = (base / f"{name}.yaml").read_text()
            import re

            ny, nx = (41, 70) if "elastic" in name else ((41, 41) if "darcy" in name else (40, 40))
            value = 2000.0 if "elastic" in name else (2.0 if "darcy" in name else 0.0003)
            if "elastic" in name:
                text = re.sub(r"(?m)^  vp: \{type: gaussian.*$", "  vp: {type: file, path: m.npy}", text)
            else:
                text = re.sub(r"(?m)^true_model: .*$", "true_model: {type: file, path: m.npy}", text)
            (a / "s.yaml").write_text(text)
            (b / "s.yaml").write_text(text)
            np.save(a / "m.npy", np.full((ny, nx), value))
            parts, args = [(1, a), (1, b)], ["train-inverse", "s.yaml", "-o", "out.h5", "-q"]
        rc, out, err = _mpmd(parts, args, env)
        finding = judge(rc, out, err, allowed=expected or (0, 1, 2, 3))
        if finding and "internal error" in finding and expected == (1,) and "injected failure" in err:
            finding = None  # the injected RuntimeError is an internal error by design
        if finding is None and expected is not None and rc not in expected:
            finding = f"rc {rc}, expected {expected}: {_last_line(err)}"
        group = label.rsplit(" on ", 1)[0].rsplit(",", 1)[0]
        codes.setdefault(group, set()).add(rc)
        print(f"{label}: rc {rc}: {_last_line(err)}", flush=True)
        tally.add("ranks", label, finding)
    for group, seen in codes.items():
        if len(seen) > 1 and "injected" not in group and "missing" not in group:
            tally.add("ranks: same code whatever the rank count", group, f"codes {sorted(seen, key=str)}")
    shutil.rmtree(base, ignore_errors=True)


CATEGORIES["ranks"] = campaign_ranks


# ---- signals at random moments -----------------------------------------------------------------

def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def campaign_signals(tally: Tally, limit: int, seed: int) -> None:
    """SIGINT or SIGTERM at a random moment of each command on the new kinds, on 1 rank (to the
    process) and 2 ranks (to mpiexec, which forwards it, or to one rank alone): 130 or 143 (or 0
    when the command had finished), no traceback, no output left unless the run completed, no hang.
    """
    folder = workdir()
    for name in ("elastic-anomaly", "darcy-permeability-mlp", "heat-implicit"):
        (folder / f"s-{name}.yaml").write_text(_small(name).replace("iterations: 1", "iterations: 3"))
    commands = [
        ["train-inverse", "s-elastic-anomaly.yaml", "-o", "out.h5", "-q"],
        ["train-inverse", "s-darcy-permeability-mlp.yaml", "-o", "out.h5", "-q"],
        ["train-inverse", "s-heat-implicit.yaml", "-o", "out.h5", "-q"],
        ["solve", "bouncing-ball.yaml", "-o", "out.h5", "-q"],
        ["train-inverse", "projectile-landing-fit.yaml", "-o", "out.h5", "-q", "--iterations", "3"],
        ["validate", "s-elastic-anomaly.yaml"],
        ["init", "pde-inverse", "-o", "out.h5"],
    ]
    rng = random.Random(seed)
    for k in range(limit):
        args = rng.choice(commands)
        signum = rng.choice([signal.SIGINT, signal.SIGTERM])
        ranks = rng.choice([1, 1, 2]) if args[0] in ("solve", "train-inverse") else 1
        target = rng.choice(["launcher", "one rank"]) if ranks > 1 else "process"
        delay = rng.uniform(0.2, 6.0)
        for p in folder.glob("out*"):
            p.unlink()
        before = {p.name for p in folder.iterdir()}
        cmd = [PYTHON, "-m", "odecli", *args]
        if ranks > 1:
            cmd = [MPIEXEC, "-n", str(ranks), *cmd]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        proc = subprocess.Popen(cmd, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        time.sleep(delay)
        pid = proc.pid
        if target == "one rank":
            hydra = _children(proc.pid)
            ranks_pids = [c for h in hydra for c in _children(h)] or hydra
            pid = rng.choice(ranks_pids) if ranks_pids else proc.pid
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass
        try:
            out, err = proc.communicate(timeout=60)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            rc = "timeout"
        out, err = out.decode(errors="replace"), err.decode(errors="replace")
        case = f"{' '.join(args[:2])} {signal.Signals(signum).name} at {delay:.1f}s on {ranks} rank(s) to the {target}"
        finding = judge(rc, out, err, allowed=(0, 3, 128 + signum))
        left = leftovers(folder, before)
        if finding is None and rc == 128 + signum and left and "was written completely" not in err:
            finding = f"left behind after rc {rc}: {left}"
        if finding is None and rc == 128 + signum and "stopped by" not in err and "interrupted" not in err:
            finding = f"rc {rc} without its line: {_last_line(err)}"
        for p in left:
            if p.startswith(("out", ".out")):
                (folder / p).unlink()
        tally.add(f"signals: {args[0]} on {ranks} rank(s)", case, finding)
    shutil.rmtree(folder, ignore_errors=True)


CATEGORIES["signals"] = campaign_signals


# ---- a signal at the K-th call into h5py (deterministic; signal_at_call.py) ---------------------

def campaign_h5_signals(tally: Tally, limit: int, seed: int) -> None:
    """For each new kind, SIGTERM at ``limit`` evenly spaced calls into h5py (the HDF5 writes of
    the output and checkpoints, the reads of model and data files): 143, the line, no output, no
    temporary, no traceback; past the last call, a success."""
    folder = workdir()
    for name in ("elastic-anomaly", "darcy-permeability-mlp", "heat-implicit"):
        (folder / f"s-{name}.yaml").write_text(_small(name).replace("iterations: 1", "iterations: 2"))
    commands = [["train-inverse", f"s-{name}.yaml", "-o", "out.h5", "-q"]
                for name in ("elastic-anomaly", "darcy-permeability-mlp", "heat-implicit")]
    commands += [["solve", "bouncing-ball.yaml", "-o", "out.h5", "-q"],
                 ["train-inverse", "projectile-landing-fit.yaml", "-o", "out.h5", "-q", "--iterations", "2"]]
    driver = [PYTHON, str(Path(__file__).with_name("signal_at_call.py"))]
    for args in commands:
        for p in folder.glob("out*"):
            p.unlink()
        rc, out, err, _ = run([*driver, "100000000", "SIGTERM", *args], folder, timeout=300)
        total = int(err.rsplit("h5py calls counted: ", 1)[1].split()[0])
        for k in sorted({max(1, total * j // limit) for j in range(limit)} | {total + 1}):
            for p in folder.glob("out*"):
                p.unlink()
            before = {p.name for p in folder.iterdir()}
            rc, out, err, _ = run([*driver, str(k), "SIGTERM", *args], folder, timeout=300)
            finding = judge(rc, out, err, allowed=(0, 3) if k > total else (143,))
            left = leftovers(folder, before)
            if finding is None and rc == 143 and left:
                finding = f"left behind after rc {rc}: {left}"
            for p in left:
                (folder / p).unlink()
            tally.add(f"signals at an h5py call: {args[0]} {args[1]}", f"{args[1]} at call {k} of {total}", finding)
    shutil.rmtree(folder, ignore_errors=True)


CATEGORIES["h5signals"] = campaign_h5_signals


if __name__ == "__main__":
    main()
