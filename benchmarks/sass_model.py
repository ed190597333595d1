"""Static throughput model of the GCM and hash kernels from their machine code: no GPU needed.

Compiles ``staging/kernels/aesgcm.cu`` for ``sm_90`` (``nvcc -cubin``), disassembles the cubin
(``nvdisasm``: next to nvcc, on PATH, or from the ``nvidia-cuda-nvdisasm`` wheel), finds the
steady-state loop of ``gcm_chunks`` (one 16-byte block of one thread per iteration), counts its
instructions by execution pipe and prints, for an H100 SXM, the throughput each pipe allows if it
were the only limit, plus the issue limit. The smallest is the kernel's modelled bound::

    python benchmarks/sass_model.py [--json] [--kernel gcm_chunks] [--min-gbps 300]
    python benchmarks/sass_model.py --kernel sha256_shards     # or blake3_chunks
    python benchmarks/sass_model.py --all                      # all three
    python benchmarks/sass_model.py --smoke   # gcm_chunks; a skip without nvcc (CI runs it)

It is a model, not a measurement: it assumes every pipe can be kept 100% busy, ignores latency,
occupancy, DRAM and scheduling, and rests on the per-pipe rates printed beside the numbers. Each
rate says whether it is a published figure (NVIDIA's H100 whitepaper or the CUDA C++ Programming
Guide's throughput table for compute capability 9.0, as recalled: not re-checked by this tool) or
an assumption. It is meant to compare versions of the kernel, and to catch a change that makes the
machine code much worse.

What is counted
---------------
* The steady-state loop: the innermost loop of the kernel that holds both a 128-bit global load
  and a 128-bit global store (the text block in and out). Its path is the longest path from the
  loop header back to it that avoids (a) blocks doing byte-wide global loads or stores (the
  partial last block of a chunk) and (b) the target of ``BRA.DIV`` (taken only by a diverged
  warp). Every instruction on that path counts once, predicated or not (a predicated-off
  instruction still issues).
* The per-tile overhead: the loop enclosing the steady-state loop (one work item per
  iteration), same path rule, the inner loop itself left out; it is shared by the ``K`` blocks a
  thread handles per tile (``GCMK_K`` in the source), so ``per block = loop + tile / K``. The
  path takes the branches of thread 0 too (it writes the tile share), so it is an upper bound
  for the other threads.

The model-digest kernels (``KERNELS`` lists each kernel's source, input bytes per iteration and
loop rule) hash one 64-byte message block per loop iteration and thread:

* ``sha256_shards`` (``sha256.cu``): one thread per shard, a loop over the shard's whole 64-byte
  blocks; ``blake3_chunks`` (``blake3.cu``): one thread per 1 KiB chunk, a loop over its 16
  blocks (one compression each).
* The steady-state loop is the loop whose path (same rules as above) holds a global load of 32
  bits or wider (the aligned message block) and the most instructions. The unaligned byte-wise
  path, the padding blocks of SHA-256 and the per-thread set-up (BLAKE3's search for the
  chunk's input, the chaining value's store) are outside it and not counted, so the bound is
  that of long shards and full chunks.
* ``GB/s = SMs x clock x lanes/clk/SM / slots per iteration x 64 B``.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "staging" / "kernels" / "aesgcm.cu"
ARCH = "sm_90"
BLOCK_BYTES = 16

# --- the machine ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Machine:
    name: str
    sms: int
    boost_ghz: float
    base_ghz: float
    clock_note: str


H100_SXM = Machine(
    name="H100 SXM5",
    sms=132,
    boost_ghz=1.98,
    base_ghz=1.59,
    clock_note="132 SMs and 1.98 GHz max boost: NVIDIA's H100 SXM5 figures; 1.59 GHz base: an "
    "assumption (the commonly listed base clock, not from an NVIDIA datasheet)",
)


@dataclasses.dataclass(frozen=True)
class Pipe:
    name: str
    lanes_per_clk: int  # thread-instruction slots per clock per SM; 0: counted for issue only
    source: str  # where the rate comes from, printed beside the bound


ISSUE = Pipe(
    "issue",
    128,
    "published: 4 SM sub-partitions x 1 warp-instruction issued per clock (32 threads each)",
)

PIPES: dict[str, Pipe] = {
    p.name: p
    for p in (
        Pipe(
            "alu",
            64,
            "published: 16 INT32 lanes per sub-partition (H100 whitepaper) = 64/clk/SM, the "
            "CUDA guide's rate for 32-bit logic, shift, add and compare on cc 9.0",
        ),
        Pipe(
            "fma",
            64,
            "published: 64/clk/SM for 32-bit integer multiply-add on cc 9.0 (CUDA guide), "
            "IMAD on the FMA-heavy pipe; assumption: IMAD.WIDE and IMAD.HI take two slots",
        ),
        Pipe(
            "shared",
            32,
            "published: 32 banks x 4 B = one conflict-free warp wavefront per clock per SM; "
            "assumption: every LDS/STS here is conflict-free or a broadcast (the T-table is "
            "bank-replicated, round keys are read at one address by the whole warp); a 64/128-bit "
            "LDS whose address is in a vector register counts bytes/4 wavefronts (conservative "
            "for broadcasts); SHFL 32/clk",
        ),
        Pipe(
            "global",
            32,
            "assumption: 128 B/clk/SM through L1 for global loads and stores, weighted by access "
            "width (a 128-bit access = 4 slots); DRAM is not modelled",
        ),
        Pipe(
            "xu",
            16,
            "published: 16/clk/SM for bit reverse, leading-zero count and popcount on cc 9.0 "
            "(CUDA guide); assumption: they share one quarter-rate pipe",
        ),
        Pipe("uniform", 0, "uniform datapath (U* opcodes): counted for issue only"),
        Pipe(
            "control",
            0,
            "branches, convergence barriers, CTA barriers, constant loads (CBU/ADU): counted "
            "for issue only",
        ),
        Pipe("other", 0, "opcode missing from the table: counted for issue only"),
    )
}

# Opcode (the part before the first '.') -> pipe. IMAD's modifiers are looked at separately.
OPCODE_PIPE: dict[str, str] = {
    **dict.fromkeys(
        (
            "LOP3 LOP SHF SHL SHR LEA PRMT IADD3 IADD VIADD ISETP ICMP SEL FSEL MOV CS2R "
            "IABS IMNMX VIMNMX PLOP3 P2R R2P BMSK SGXT"
        ).split(),
        "alu",
    ),
    **dict.fromkeys("IMAD IMUL IMADSP IDP".split(), "fma"),
    **dict.fromkeys("LDS STS LDSM ATOMS SHFL".split(), "shared"),
    **dict.fromkeys("LDG STG LD ST LDL STL ATOMG ATOM RED".split(), "global"),
    **dict.fromkeys("BREV FLO POPC MUFU I2F F2I I2I F2F".split(), "xu"),
    **dict.fromkeys(
        (
            "BRA BRX JMP JMX CALL RET EXIT BSSY BSYNC WARPSYNC BAR BPT NOP YIELD BMOV "
            "S2R VOTE MEMBAR DEPBAR ERRBAR CCTL LDC"
        ).split(),
        "control",
    ),
}

_WIDTH = re.compile(r"\.(U8|S8|U16|S16|32|64|128)\b")


def pipe_of(opcode: str) -> str:
    base = opcode.split(".", 1)[0]
    if base in OPCODE_PIPE:
        return OPCODE_PIPE[base]
    if base.startswith("U") or base in ("S2UR", "R2UR"):
        return "uniform"
    return "other"


def slots_of(ins: Instr) -> int:
    """Pipe slots one thread-instruction takes (see each pipe's ``source``)."""
    pipe = pipe_of(ins.opcode)
    parts = ins.opcode.split(".")
    if pipe == "fma" and ("WIDE" in parts or "HI" in parts):
        return 2
    if pipe in ("shared", "global") and parts[0] != "SHFL":
        width = 4
        for m in _WIDTH.finditer(ins.opcode):
            width = {"U8": 1, "S8": 1, "U16": 2, "S16": 2, "32": 4, "64": 8, "128": 16}[m.group(1)]
        words = max(1, width // 4)
        if pipe == "shared" and words > 1 and _uniform_address(ins.operands):
            return 1  # the same address in every lane: one broadcast wavefront
        return words
    return 1


def _uniform_address(operands: str) -> bool:
    """The memory operand uses no vector register (only uniform registers and immediates)."""
    m = re.search(r"\[([^\]]*)\]", operands)
    return m is not None and re.search(r"(?<!\w)R\d+", m.group(1)) is None


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """What the model needs to know about one kernel."""

    name: str
    source: Path
    bytes_per_iteration: int  # input bytes one thread consumes per steady-state iteration
    loop_rule: str  # "vector-load-store" (gcm) or "widest-word-load" (the hash kernels)
    per_tile: bool  # model the enclosing loop's overhead, shared by K iterations


KERNELS: dict[str, KernelSpec] = {
    s.name: s
    for s in (
        KernelSpec(
            "gcm_chunks",
            SOURCE,
            BLOCK_BYTES,
            "vector-load-store",
            True,
        ),
        KernelSpec(
            "gcm_msgs",
            SOURCE,
            BLOCK_BYTES,
            "vector-load-store",
            True,
        ),
        KernelSpec(
            "sha256_shards",
            ROOT / "staging" / "kernels" / "sha256.cu",
            64,
            "widest-word-load",
            False,
        ),
        KernelSpec(
            "blake3_chunks",
            ROOT / "staging" / "kernels" / "blake3.cu",
            64,
            "widest-word-load",
            False,
        ),
    )
}


# --- disassembly ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Instr:
    offset: int
    guard: str  # "" or the predicate guard, e.g. "@!P0"
    opcode: str
    operands: str


@dataclasses.dataclass
class Block:
    index: int
    label: str | None
    instrs: list[Instr]
    succs: list[int] = dataclasses.field(default_factory=list)
    cold_succs: set[int] = dataclasses.field(default_factory=set)  # BRA.DIV targets


_SECTION = re.compile(r"^\s*\.section\s+\.text\.([A-Za-z_]\w*),")
_LABEL = re.compile(r"^(\.L\w+):")
_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
_TARGET = re.compile(r"`\((\.L\w+)\)")


def parse_functions(sass: str) -> dict[str, list[tuple[str | None, Instr | None]]]:
    """nvdisasm text -> {function: [(label, None) | (None, instruction), ...]} in address order."""
    funcs: dict[str, list[tuple[str | None, Instr | None]]] = {}
    current: list[tuple[str | None, Instr | None]] | None = None
    for line in sass.splitlines():
        m = _SECTION.match(line)
        if m:
            current = funcs.setdefault(m.group(1), [])
            continue
        if current is None:
            continue
        m = _LABEL.match(line)
        if m:
            current.append((m.group(1), None))
            continue
        m = _INSTR.match(line)
        if m:
            guard = (m.group(2) or "").strip()
            current.append((None, Instr(int(m.group(1), 16), guard, m.group(3), m.group(4))))
    return funcs


def _is_terminator(ins: Instr) -> bool:
    base = ins.opcode.split(".", 1)[0]
    return base in ("BRA", "BRX", "JMP", "JMX", "RET", "EXIT", "BPT")


def _falls_through(ins: Instr) -> bool:
    base = ins.opcode.split(".", 1)[0]
    if base in ("BRX", "JMX", "RET", "BPT"):
        return False
    conditional = bool(ins.guard) and ins.guard not in ("@PT",)
    if base in ("BRA", "JMP"):
        # BRA.DIV and BRA.U test a (uniform) condition; plain BRA with no guard always jumps.
        return conditional or "." in ins.opcode
    return conditional  # EXIT


def build_cfg(items: Sequence[tuple[str | None, Instr | None]]) -> list[Block]:
    blocks: list[Block] = []
    label_block: dict[str, int] = {}
    pending: list[str] = []
    cur: Block | None = None
    for label, ins in items:
        if label is not None:
            pending.append(label)
            cur = None
            continue
        assert ins is not None
        if cur is None:
            cur = Block(len(blocks), pending[0] if pending else None, [])
            for lab in pending:
                label_block[lab] = cur.index
            pending = []
            blocks.append(cur)
        cur.instrs.append(ins)
        if _is_terminator(ins):
            cur = None
    for b in blocks:
        last = b.instrs[-1]
        if _is_terminator(last):
            tm = _TARGET.search(last.operands)
            if tm and tm.group(1) in label_block:
                tgt = label_block[tm.group(1)]
                b.succs.append(tgt)
                if last.opcode.startswith("BRA.DIV"):
                    b.cold_succs.add(tgt)
            if _falls_through(last) and b.index + 1 < len(blocks):
                b.succs.append(b.index + 1)
        elif b.index + 1 < len(blocks):
            b.succs.append(b.index + 1)
    return blocks


def _dominators(blocks: Sequence[Block]) -> list[set[int]]:
    n = len(blocks)
    preds: list[list[int]] = [[] for _ in range(n)]
    for b in blocks:
        for s in b.succs:
            preds[s].append(b.index)
    everything = set(range(n))
    dom = [set(everything) for _ in range(n)]
    dom[0] = {0}
    changed = True
    while changed:
        changed = False
        for i in range(1, n):
            ps = [dom[p] for p in preds[i]]
            new = set.intersection(*ps) | {i} if ps else {i}
            if new != dom[i]:
                dom[i] = new
                changed = True
    return dom


@dataclasses.dataclass(frozen=True)
class Loop:
    header: int
    body: frozenset[int]
    latches: frozenset[int]


def natural_loops(blocks: Sequence[Block]) -> list[Loop]:
    dom = _dominators(blocks)
    preds: list[list[int]] = [[] for _ in blocks]
    back: dict[int, set[int]] = {}
    for b in blocks:
        for s in b.succs:
            preds[s].append(b.index)
            if s in dom[b.index]:
                back.setdefault(s, set()).add(b.index)
    loops = []
    for h, latches in back.items():
        body = {h}
        work = [u for u in latches if u != h]
        body.update(work)
        while work:
            u = work.pop()
            for p in preds[u]:
                if p not in body:
                    body.add(p)
                    work.append(p)
        loops.append(Loop(h, frozenset(body), frozenset(latches)))
    return loops


def _is_tail_block(b: Block) -> bool:
    """Byte-wide global loads/stores: the partial last block of a chunk, not the steady state."""
    return any(
        ins.opcode.split(".", 1)[0] in ("LDG", "STG")
        and re.search(r"\.(U8|S8|U16|S16)\b", ins.opcode) is not None
        for ins in b.instrs
    )


def _has_vector_global(b: Block, op: str) -> bool:
    return any(ins.opcode.startswith(op) and ".128" in ins.opcode for ins in b.instrs)


def longest_path(blocks: Sequence[Block], loop: Loop, inner: Iterable[Loop]) -> list[Instr]:
    """Instructions on the longest header-to-latch path of ``loop`` (see the module docstring);
    each loop nested in it counts as a node with no instructions."""
    node_of: dict[int, int] = {}  # block -> node; a nested loop is one node, -1 - its header
    for sub in sorted(inner, key=lambda lp: -len(lp.body)):  # outermost nested loops first
        for i in sub.body:
            node_of.setdefault(i, -1 - sub.header)
    members: dict[int, list[int]] = {}
    for i in loop.body:
        members.setdefault(node_of.get(i, i), []).append(i)

    def succs(node: int) -> set[int]:
        out: set[int] = set()
        for i in members[node]:
            b = blocks[i]
            for s in b.succs:
                if s in b.cold_succs or s not in loop.body or s == loop.header:
                    continue
                if _is_tail_block(blocks[s]):
                    continue
                t = node_of.get(s, s)
                if t != node:
                    out.add(t)
        return out

    def weight(node: int) -> list[Instr]:
        return [] if node < 0 else blocks[node].instrs

    def is_latch(node: int) -> bool:
        return any(i in loop.latches for i in members[node])

    best: dict[int, list[int] | None] = {}
    visiting: set[int] = set()

    def walk(node: int) -> list[int] | None:
        if node in best:
            return best[node]
        if node in visiting:
            raise ValueError("irreducible control flow inside the loop")
        visiting.add(node)
        options: list[list[int]] = [[node]] if is_latch(node) else []
        for s in succs(node):
            tail = walk(s)
            if tail is not None:
                options.append([node, *tail])
        visiting.discard(node)
        result = max(options, key=lambda p: sum(len(weight(n)) for n in p)) if options else None
        best[node] = result
        return result

    path = walk(node_of.get(loop.header, loop.header))
    if path is None:
        raise ValueError("no steady-state path through the loop")
    return [ins for n in path for ins in weight(n)]


# --- counting and bounds ------------------------------------------------------------------------


@dataclasses.dataclass
class Counts:
    instructions: int
    by_pipe: dict[str, int]  # thread-instructions
    slots: dict[str, int]  # pipe slots (see slots_of)
    by_opcode: dict[str, int]  # base opcode -> count


def count(instrs: Iterable[Instr]) -> Counts:
    by_pipe: dict[str, int] = dict.fromkeys(PIPES, 0)
    slots: dict[str, int] = dict.fromkeys(PIPES, 0)
    by_opcode: dict[str, int] = {}
    n = 0
    for ins in instrs:
        n += 1
        p = pipe_of(ins.opcode)
        by_pipe[p] += 1
        slots[p] += slots_of(ins)
        base = ins.opcode.split(".", 1)[0]
        if base == "IMAD" and (".WIDE" in ins.opcode or ".HI" in ins.opcode):
            base = "IMAD.WIDE" if ".WIDE" in ins.opcode else "IMAD.HI"
        by_opcode[base] = by_opcode.get(base, 0) + 1
    return Counts(n, by_pipe, slots, dict(sorted(by_opcode.items(), key=lambda kv: -kv[1])))


def bound_gbps(
    slots_per_block: float,
    lanes_per_clk: int,
    ghz: float,
    sms: int,
    block_bytes: int = BLOCK_BYTES,
) -> float | None:
    if lanes_per_clk == 0 or slots_per_block <= 0:
        return None
    blocks_per_s = sms * ghz * 1e9 * lanes_per_clk / slots_per_block
    return blocks_per_s * block_bytes / 1e9


@dataclasses.dataclass
class KernelModel:
    kernel: str
    k: int
    loop: Counts
    tile: Counts
    ptxas: dict[str, int]
    block_bytes: int = BLOCK_BYTES  # input bytes per loop iteration
    per_tile: bool = True  # the tile overhead is modelled (False: the loop alone)

    def per_block(self, amortized: bool) -> dict[str, float]:
        """Pipe slots (and 'issue': instructions) per iteration (``block_bytes`` of input)."""
        extra = 1.0 / self.k if amortized else 0.0
        out = {p: self.loop.slots[p] + extra * self.tile.slots[p] for p in PIPES}
        out["issue"] = self.loop.instructions + extra * self.tile.instructions
        return out

    def bounds(self, amortized: bool, machine: Machine = H100_SXM) -> dict[str, Any]:
        per = self.per_block(amortized)
        rows: list[dict[str, Any]] = []
        best: tuple[float, str, float] | None = None  # (boost GB/s, pipe, base GB/s)
        for pipe in (*PIPES.values(), ISSUE):
            need, lanes = per[pipe.name], pipe.lanes_per_clk
            boost = bound_gbps(need, lanes, machine.boost_ghz, machine.sms, self.block_bytes)
            base = bound_gbps(need, lanes, machine.base_ghz, machine.sms, self.block_bytes)
            rows.append(
                {
                    "pipe": pipe.name,
                    "per_block": round(need, 2),
                    "lanes_per_clk_per_sm": lanes,
                    "gbps_boost": _round(boost),
                    "gbps_base": _round(base),
                    "source": pipe.source,
                }
            )
            if boost is not None and base is not None and (best is None or boost < best[0]):
                best = (boost, pipe.name, base)
        assert best is not None  # the issue limit always applies
        return {
            "rows": rows,
            "limiter": best[1],
            "gbps_boost": round(best[0], 1),
            "gbps_base": round(best[2], 1),
        }

    def to_json(self, machine: Machine = H100_SXM) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kernel": self.kernel,
            "arch": ARCH,
            "machine": dataclasses.asdict(machine),
            "blocks_per_thread_per_tile": self.k,
            "ptxas": self.ptxas,
            "loop": dataclasses.asdict(self.loop),
            "tile_overhead": dataclasses.asdict(self.tile),
            "steady_state": self.bounds(amortized=False, machine=machine),
            "amortized": self.bounds(amortized=True, machine=machine),
        }
        if self.block_bytes != BLOCK_BYTES or not self.per_tile:
            out["bytes_per_iteration"] = self.block_bytes
            out["tile_modelled"] = self.per_tile
        return out


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


# --- tools ----------------------------------------------------------------------------------


def find_nvcc() -> str | None:
    return shutil.which("nvcc")


def find_disassembler(nvcc: str | None) -> str | None:
    """nvdisasm next to nvcc, then on PATH, then from the nvidia-cuda-nvdisasm wheel."""
    if nvcc is not None:
        beside = Path(nvcc).resolve().parent / "nvdisasm"
        if beside.is_file() and os.access(beside, os.X_OK):
            return str(beside)
    found = shutil.which("nvdisasm")
    if found:
        return found
    spec = importlib.util.find_spec("nvidia")
    bases = list(spec.submodule_search_locations or []) if spec is not None else []
    for base in bases:
        for cand in sorted(glob.glob(os.path.join(base, "cu*", "bin", "nvdisasm")), reverse=True):
            if os.access(cand, os.X_OK):
                return cand
    return None


_PTXAS_ENTRY = re.compile(r"Compiling entry function '(\w+)'")
_PTXAS_PROPS = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)
_PTXAS_REGS = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


def parse_ptxas(log: str) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    current: str | None = None
    for line in log.splitlines():
        m = _PTXAS_ENTRY.search(line)
        if m:
            current = m.group(1)
            out[current] = {}
            continue
        if current is None:
            continue
        m = _PTXAS_PROPS.search(line)
        if m:
            out[current].update(
                stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3))
            )
        m = _PTXAS_REGS.search(line)
        if m:
            out[current]["registers"] = int(m.group(1))
            if m.group(2) is not None:  # absent when the kernel uses no shared memory
                out[current]["smem"] = int(m.group(2))
    return out


def compile_and_disassemble(
    source: Path, nvcc: str, nvdisasm: str, defines: Sequence[str] = ()
) -> tuple[str, str]:
    """Returns (ptxas log, nvdisasm text)."""
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernels.cubin"
        cmd = [nvcc, f"-arch={ARCH}", "-cubin", "-Xptxas", "-v", "-o", str(cubin)]
        cmd += [f"-D{d}" for d in defines] + [str(source)]
        built = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
        if built.returncode != 0:
            raise RuntimeError(f"nvcc failed:\n{built.stdout}{built.stderr}")
        return built.stdout + built.stderr, disassemble(cubin, nvdisasm)


def blocks_per_thread(source: Path) -> int:
    m = re.search(r"#define\s+GCMK_K\s+(\d+)", source.read_text())
    return int(m.group(1)) if m else 4


def _has_word_global_load(b: Block) -> bool:
    """A global load of 32 bits or wider (not byte-wide)."""
    return any(
        ins.opcode.split(".", 1)[0] == "LDG"
        and re.search(r"\.(U8|S8|U16|S16)\b", ins.opcode) is None
        for ins in b.instrs
    )


def model_hash_kernel(sass: str, spec: KernelSpec, ptxas: dict[str, int]) -> KernelModel:
    """The loop whose steady path holds a word-wide global load and the most instructions."""
    funcs = parse_functions(sass)
    if spec.name not in funcs:
        raise ValueError(f"{spec.name} not in the disassembly (found: {', '.join(sorted(funcs))})")
    blocks = build_cfg(funcs[spec.name])
    loops = natural_loops(blocks)
    best: list[Instr] | None = None
    for lp in loops:
        nested = [other for other in loops if other.body < lp.body]
        try:
            path = longest_path(blocks, lp, nested)
        except ValueError:
            continue
        on_path = {id(ins) for ins in path}
        loads = any(
            _has_word_global_load(b) and all(id(ins) in on_path for ins in b.instrs)
            for b in (blocks[i] for i in lp.body)
        )
        if loads and (best is None or len(path) > len(best)):
            best = path
    if best is None:
        raise ValueError(f"{spec.name}: no loop with a 32-bit or wider global load")
    return KernelModel(
        spec.name, 1, count(best), count([]), ptxas, spec.bytes_per_iteration, per_tile=False
    )


def model_kernel(sass: str, kernel: str, k: int, ptxas: dict[str, int]) -> KernelModel:
    spec = KERNELS.get(kernel)
    if spec is not None and spec.loop_rule == "widest-word-load":
        return model_hash_kernel(sass, spec, ptxas)
    funcs = parse_functions(sass)
    if kernel not in funcs:
        raise ValueError(f"{kernel} not in the disassembly (found: {', '.join(sorted(funcs))})")
    blocks = build_cfg(funcs[kernel])
    loops = natural_loops(blocks)
    steady = [
        lp
        for lp in loops
        if any(_has_vector_global(blocks[i], "LDG") for i in lp.body)
        and any(_has_vector_global(blocks[i], "STG") for i in lp.body)
    ]
    if not steady:
        raise ValueError(f"{kernel}: no loop with a 128-bit global load and store")
    inner = min(steady, key=lambda lp: len(lp.body))
    outer_cands = [lp for lp in loops if lp.body > inner.body]
    nested_in = [lp for lp in loops if lp.body < inner.body]
    loop_counts = count(longest_path(blocks, inner, nested_in))
    if outer_cands:
        outer = min(outer_cands, key=lambda lp: len(lp.body))
        children = [lp for lp in loops if lp.body < outer.body]
        tile_counts = count(longest_path(blocks, outer, children))
    else:
        tile_counts = count([])
    return KernelModel(kernel, k, loop_counts, tile_counts, ptxas)


def disassemble(cubin: Path, nvdisasm: str) -> str:
    dis = subprocess.run(
        [nvdisasm, "-c", str(cubin)], capture_output=True, text=True, timeout=300, check=False
    )
    if dis.returncode != 0:
        raise RuntimeError(f"nvdisasm failed:\n{dis.stderr}")
    return dis.stdout


def run_model(
    source: Path | None = None, kernel: str = "gcm_chunks", cubin: Path | None = None
) -> KernelModel:
    """Model ``kernel`` as nvcc builds it from ``source`` (default: the kernel's own file in
    ``KERNELS``), or as found in a prebuilt ``cubin`` (for example what NVRTC built at run time;
    ptxas' report is then unknown)."""
    if source is None:
        source = KERNELS[kernel].source if kernel in KERNELS else SOURCE
    nvcc = find_nvcc()
    if nvcc is None and cubin is None:
        raise FileNotFoundError("nvcc is not installed")
    nvdisasm = find_disassembler(nvcc)
    if nvdisasm is None:
        raise FileNotFoundError(
            "nvdisasm not found (install the nvidia-cuda-nvdisasm wheel: pip install -e '.[test]')"
        )
    if cubin is not None:
        return model_kernel(disassemble(cubin, nvdisasm), kernel, blocks_per_thread(source), {})
    assert nvcc is not None
    log, sass = compile_and_disassemble(source, nvcc, nvdisasm)
    ptxas = parse_ptxas(log).get(kernel, {})
    return model_kernel(sass, kernel, blocks_per_thread(source), ptxas)


# --- output ---------------------------------------------------------------------------------


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def render(model: KernelModel, machine: Machine = H100_SXM) -> str:
    nbytes = model.block_bytes
    if model.per_tile:
        loop_line = (
            f"steady-state loop: {model.loop.instructions} instructions per {nbytes}-byte block; "
            f"per-tile overhead: {model.tile.instructions} per thread per tile of K={model.k} "
            "blocks"
        )
    else:
        loop_line = (
            f"steady-state loop: {model.loop.instructions} instructions per {nbytes}-byte block; "
            "per-thread set-up and tail outside the loop: not counted"
        )
    lines = [
        f"Static model of {model.kernel} ({ARCH}, {machine.name}: {machine.sms} SMs, "
        f"{machine.boost_ghz} GHz boost / {machine.base_ghz} GHz base). Not a measurement.",
        f"ptxas: {model.ptxas}",
        loop_line,
        "top opcodes in the loop: "
        + ", ".join(f"{op} {n}" for op, n in list(model.loop.by_opcode.items())[:12]),
        "",
        f"{'pipe':<8} {'instr':>6} {'slots':>7} {'+tile/K':>8} {'lanes/clk/SM':>12} "
        f"{'GB/s boost':>10} {'GB/s base':>9}",
    ]
    amort = model.bounds(amortized=True, machine=machine)
    steady = model.bounds(amortized=False, machine=machine)
    for srow, arow in zip(steady["rows"], amort["rows"], strict=True):
        name = srow["pipe"]
        instr = model.loop.instructions if name == "issue" else model.loop.by_pipe[name]
        lanes = srow["lanes_per_clk_per_sm"] or "-"
        lines.append(
            f"{name:<8} {instr:>6} {srow['per_block']:>7.0f} {arow['per_block']:>8.1f} "
            f"{lanes!s:>12} {_fmt(arow['gbps_boost']):>10} {_fmt(arow['gbps_base']):>9}"
        )
    lines += [
        "",
        f"bound, steady-state loop only: {steady['gbps_boost']:.0f} GB/s at boost, "
        f"{steady['gbps_base']:.0f} at base ({steady['limiter']}-limited)",
    ]
    if model.per_tile:
        lines += [
            f"bound with the per-tile overhead: {amort['gbps_boost']:.0f} GB/s at boost, "
            f"{amort['gbps_base']:.0f} at base ({amort['limiter']}-limited)",
            "",
            "instr: thread-instructions per block in the loop; slots: pipe slots they take; "
            "+tile/K: slots with the per-tile overhead shared by K blocks (the GB/s columns use "
            "it).",
            "GB/s = SMs x clock x lanes/clk/SM / slots per block x 16 B of text.",
        ]
    else:
        lines += [
            "",
            "instr: thread-instructions per block in the loop; slots: pipe slots they take; "
            "+tile/K: the same (no per-tile overhead is modelled).",
            f"GB/s = SMs x clock x lanes/clk/SM / slots per block x {nbytes} B of message.",
        ]
    lines += [
        f"clocks: {machine.clock_note}.",
        "rates:",
        *(f"  {p.name:<8} {p.source}" for p in (*PIPES.values(), ISSUE)),
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument(
        "--source", type=Path, default=None, help="default: the kernel's own file (see KERNELS)"
    )
    ap.add_argument(
        "--cubin", type=Path, default=None, help="model this prebuilt cubin instead of compiling"
    )
    ap.add_argument("--kernel", default="gcm_chunks", help=f"one of: {', '.join(KERNELS)}")
    ap.add_argument("--all", action="store_true", help="model every kernel in KERNELS")
    ap.add_argument("--json", action="store_true", help="print the model as JSON")
    ap.add_argument(
        "--min-gbps",
        type=float,
        default=None,
        help="exit 1 if the bound with per-tile overhead at boost clock is below this (with "
        "--all: for any kernel)",
    )
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="model gcm_chunks once; says it skipped where nvcc or nvdisasm is missing",
    )
    args = ap.parse_args(argv)
    if args.smoke:
        nvcc = find_nvcc()
        if args.cubin is None and (nvcc is None or find_disassembler(nvcc) is None):
            print("sass_model: skipped: needs nvcc and nvdisasm, not installed here")
            return 0
    if args.all and (args.source is not None or args.cubin is not None):
        print("sass_model: --all builds every kernel from its own source", file=sys.stderr)
        return 2
    names = list(KERNELS) if args.all else [args.kernel]
    models: list[KernelModel] = []
    try:
        for name in names:
            models.append(run_model(args.source, name, args.cubin))
    except (FileNotFoundError, RuntimeError, ValueError) as exc:
        print(f"sass_model: {exc}", file=sys.stderr)
        return 2
    if args.json:
        data = [m.to_json() for m in models]
        print(json.dumps(data if args.all else data[0], indent=2))
    else:
        print("\n\n".join(render(m) for m in models))
    status = 0
    for model in models:
        bound = model.bounds(amortized=True)["gbps_boost"]
        if args.min_gbps is not None and bound < args.min_gbps:
            print(
                f"sass_model: modelled bound of {model.kernel} is {bound:.0f} GB/s, "
                f"below {args.min_gbps:.0f}",
                file=sys.stderr,
            )
            status = 1
    return status


if __name__ == "__main__":
    raise SystemExit(main())
