#!/usr/bin/env python3
"""The layer check: every include of src/ runs one way down the stack that src/CMakeLists.txt
declares, and no folders of src/ include each other.

    check_layers.py --layers BUILD/layers.txt [--src DIR] [--include DIR]
    check_layers.py --self-test --layers BUILD/layers.txt   (plants violations in a copy of src/)

The layer map (written by CMake's mirrored_layer()) has two lines per layer:
    NAME depends: LAYER...      the layers whose private headers NAME may include
    NAME owns: HEADER...        public headers (include/mirrored/) that no layer below NAME includes
Rules, each reported with the file, line and include (private headers are included by their path
from src/; one included relative to the including file, or through "..", is reported as such):
  1. a private include ("LAYER/...") of another layer must name a layer in NAME's depends list;
  2. a public include ("mirrored/HEADER") must not name a header owned by a layer above NAME
     (one that NAME may not include, directly or through the layers it depends on);
  3. the folders of src/, linked by the includes between their files, form no cycle (a folder and
     its subfolder count as two folders, so an interface folder never includes its backends'
     headers when they include it);
  4. a file of another layer includes no header of a backend: a subfolder of a layer in
     BACKEND_LAYERS (every subfolder of src/device/, present or future, is a backend; the headers
     directly in src/device/ are the interface the layers above use), unless the pair (the
     including file's folder or one above it, the backend's folder) is in ALLOWED_BACKEND_INCLUDES:
     code that is that backend's by nature, such as NCCL's on CUDA's streams.
Exit status 0 when the tree follows every rule, 1 with the violations on stderr, 2 on bad usage.
"""
import argparse
import os
import re
import shutil
import sys
import tempfile

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCES = (".cpp", ".hpp", ".h", ".cu", ".cuh")

# Layers whose subfolders are backends behind the interface in the layer's own folder (rule 4).
BACKEND_LAYERS = ("device",)

# (including folder, backend folder) -> why that code may include the backend's headers (rule 4).
# The including folder covers its subfolders too. Each pair is backend-specific by nature; anything
# else asks the device interface (src/device/*.hpp).
ALLOWED_BACKEND_INCLUDES = {
    ("collectives/nccl", "device/cuda"): "NCCL is CUDA's: the all-reduce runs on the CUDA backend's streams",
    ("cluster/transport/nccl", "device/cuda"): "NCCL is CUDA's: the transport runs on the CUDA backend's streams",
    ("runtime/cuda", "device/cuda"): "<mirrored/cuda.hpp> hands out the CUDA backend's streams and allocator",
}


def read_layers(path):
    depends, owns, order = {}, {}, []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            m = re.fullmatch(r"(\w+) (depends|owns):(.*)", line)
            if not m:
                raise SystemExit(f"{path}:{n}: not a layer line: {line!r}")
            name, kind, rest = m.group(1), m.group(2), m.group(3).split()
            if name not in depends:
                order.append(name)
                depends[name], owns[name] = set(), set()
            (depends if kind == "depends" else owns)[name].update(rest)
    for name in order:
        for dep in depends[name]:
            if dep not in depends:
                raise SystemExit(f"{path}: layer {name} depends on unknown layer {dep}")
    return order, depends, owns


def reachable(depends, name):
    """Every layer `name` may reach down the stack (itself included)."""
    seen, todo = {name}, [name]
    while todo:
        for dep in depends[todo.pop()]:
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def source_files(src):
    for root, dirs, files in os.walk(src):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(SOURCES):
                yield os.path.join(root, name)


def backend_include_allowed(folder, backend):
    """Whether a file in `folder` may include headers of `backend` (ALLOWED_BACKEND_INCLUDES)."""
    return any(backend == to and (folder == at or folder.startswith(at + "/"))
               for at, to in ALLOWED_BACKEND_INCLUDES)


def check(src, layers_path):
    order, depends, owns = read_layers(layers_path)
    below = {name: reachable(depends, name) for name in order}
    owner = {h: name for name in order for h in owns[name]}
    problems = []
    edges = {}  # folder -> {folder: first "file:line" that links them}
    for path in source_files(src):
        rel = os.path.relpath(path, src).replace(os.sep, "/")
        folder = os.path.dirname(rel)
        layer = rel.split("/", 1)[0]
        if layer not in depends:
            problems.append(f"src/{rel}: lies in no declared layer (src/CMakeLists.txt declares {', '.join(order)})")
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
        for n, line in enumerate(lines, 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            target = m.group(1)
            first = target.split("/", 1)[0]
            where = f"src/{rel}:{n}"
            if first == "mirrored":
                header = target[len("mirrored/"):]
                up = owner.get(header)
                if up is not None and up not in below[layer]:
                    problems.append(f"{where}: includes \"{target}\", a header of layer {up}, which layer "
                                    f"{layer} is below (it may include: {', '.join(sorted(below[layer]))})")
                continue
            if first not in depends:
                # Relative to the including file, a private header would escape rules 1 and 3.
                if ".." in target.split("/") or os.path.exists(os.path.join(os.path.dirname(path), target)):
                    problems.append(f"{where}: includes \"{target}\" relative to its own folder; include "
                                    f"private headers by their path from src/ (\"{layer}/...\")")
                continue  # a system or third-party header, or a path of the include folder
            if first != layer and first not in depends[layer]:
                allowed = ", ".join(sorted(depends[layer])) or "no other layer"
                problems.append(f"{where}: includes \"{target}\": layer {layer} may include {allowed}, "
                                f"not {first}")
            parts = target.split("/")
            if first != layer and first in BACKEND_LAYERS and len(parts) > 2:
                backend = "/".join(parts[:2])
                if not backend_include_allowed(folder, backend):
                    problems.append(f"{where}: includes \"{target}\", a header of backend {backend}/: use the "
                                    f"{first} interface (the headers directly in src/{first}/); ({folder}, "
                                    f"{backend}) is not in check_layers.py's ALLOWED_BACKEND_INCLUDES")
            if os.path.exists(os.path.join(src, target)):
                to = os.path.dirname(target)
                if to != folder:
                    edges.setdefault(folder, {}).setdefault(to, where)
    problems.extend(folder_cycles(edges))
    return problems


def folder_cycles(edges):
    """One message per cycle found among the folders (depth-first, each cycle once)."""
    out, state, stack = [], {}, []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, {})):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                links = "; ".join(f"{a}/ -> {b}/ at {edges[a][b]}" for a, b in zip(cycle, cycle[1:]))
                out.append(f"folders include each other: {' -> '.join(c + '/' for c in cycle)} ({links})")
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    return out


def self_test(src, layers_path):
    """The check passes on the tree, and fails on each planted violation of a copy of it."""
    failures = []
    clean = check(src, layers_path)
    if clean:
        failures.append("the tree itself fails the check:\n  " + "\n  ".join(clean))
    plants = [
        # ({file: line appended}, what a message must say)
        ({"device/device.cpp": '#include "runtime/strategy_runtime.hpp"'}, "layer device may include"),
        ({"device/device.cpp": '#include "mirrored/collective_step.hpp"'}, "a header of layer collectives"),
        ({"device/host/host_backend.hpp": '#include "device/gpu/gpu_backend.hpp"',
          "device/gpu/gpu_backend.hpp": '#include "device/host/host_allocator.hpp"'},
         "folders include each other: device/gpu/ -> device/host/ -> device/gpu/"),
        ({"device/host/host_backend.cpp": '#include "../gpu/gpu_backend.hpp"'}, "relative to its own folder"),
        ({"collectives/collective_plan.cpp": '#include "device/gpu/logical_gpus.hpp"'},
         'includes "device/gpu/logical_gpus.hpp", a header of backend device/gpu/'),
        # The allow-list names pairs: NCCL code may include the CUDA backend, not another one.
        ({"collectives/nccl/nccl_comms.hpp": '#include "device/simulated/sim_backend.hpp"'},
         "a header of backend device/simulated/"),
        # Any subfolder of device/ is a backend, one that does not exist yet included.
        ({"runtime/strategy.cpp": '#include "device/tpu/tpu_backend.hpp"'}, "a header of backend device/tpu/"),
    ]
    for edits, expect in plants:
        with tempfile.TemporaryDirectory() as tmp:
            copy = os.path.join(tmp, "src")
            shutil.copytree(src, copy)
            for file, line in edits.items():
                with open(os.path.join(copy, file), "a", encoding="utf-8") as f:
                    f.write("\n" + line + "\n")
            found = check(copy, layers_path)
            planted = "; ".join(f"{file}: {line}" for file, line in edits.items())
            if not any(expect in p for p in found):
                failures.append(f"planted {planted}: not reported as {expect!r}; got: {found}")
            else:
                print(f"planted {planted}\n  -> " + "\n  -> ".join(found))
    return failures


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", required=True, help="the layer map CMake writes (BUILD/layers.txt)")
    ap.add_argument("--src", default=os.path.join(here, "..", "src"))
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    src = os.path.normpath(args.src)
    if args.self_test:
        failures = self_test(src, args.layers)
        for f in failures:
            print("self-test: " + f, file=sys.stderr)
        print("layer check self-test: " + ("failed" if failures else "every planted violation was reported"))
        return 1 if failures else 0
    problems = check(src, args.layers)
    for p in problems:
        print(p, file=sys.stderr)
    print(f"layer check: {len(problems)} violation(s) in {src}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
