"""The static SASS model (benchmarks/sass_model.py): its control-flow rules on a small hand-written
listing (always), and its structure on the real kernel (needs nvcc and nvdisasm).

No timing is asserted: the model's GB/s figures are printed by CI, and CI's gate on them lives in
``.ci/run``; here only the counts' structure is checked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import sass_model  # noqa: E402

# A loop with a diverged-warp detour (BRA.DIV), a partial-block path (byte stores) and a skipped
# body, nested in an outer loop, in nvdisasm's layout.
LISTING = """
\t.section\t.text.toy,"ax",@progbits
toy:
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
        /*0010*/                   IADD3 R2, R2, 0x1, RZ ;
.L_x_1:
        /*0020*/                   ISETP.GE.AND P0, PT, R2, R3, PT ;
        /*0030*/               @P0 BRA `(.L_x_2) ;
        /*0040*/                   LDG.E.128 R4, desc[UR4][R8.64] ;
        /*0050*/                   LDS R12, [R13+0x10] ;
        /*0060*/                   LDS.128 R16, [UR4+0x8000] ;
        /*0070*/                   IMAD.WIDE.U32 R20, R4, R5, RZ ;
        /*0080*/                   PRMT R6, R6, 0x2103, R6 ;
        /*0090*/                   BRA.DIV UR5, `(.L_x_5) ;
        /*00a0*/                   SHFL.BFLY PT, R7, R6, 0x1, 0x1f ;
.L_x_6:
        /*00b0*/              @!P1 STG.E.128 desc[UR4][R10.64], R4 ;
        /*00c0*/              @!P1 BRA `(.L_x_3) ;
        /*00d0*/                   STG.E.U8 desc[UR4][R10.64], R4 ;
        /*00e0*/                   STG.E.U8 desc[UR4][R10.64+0x1], R5 ;
.L_x_3:
        /*00f0*/                   LOP3.LUT R4, R4, R5, R6, 0x96, !PT ;
.L_x_2:
        /*0100*/                   ISETP.NE.AND P2, PT, R2, R9, PT ;
        /*0110*/               @P2 BRA `(.L_x_1) ;
        /*0120*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0130*/                   ISETP.NE.AND P3, PT, R2, R14, PT ;
        /*0140*/               @P3 BRA `(.L_x_0) ;
        /*0150*/                   EXIT ;
.L_x_5:
        /*0160*/                   WARPSYNC.ALL ;
        /*0170*/                   NOP ;
        /*0180*/                   NOP ;
        /*0190*/                   NOP ;
        /*01a0*/                   NOP ;
        /*01b0*/                   BRA `(.L_x_6) ;
"""


def _toy() -> sass_model.KernelModel:
    return sass_model.model_kernel(LISTING, "toy", 2, {})


def test_listing_is_parsed_into_blocks_and_loops() -> None:
    funcs = sass_model.parse_functions(LISTING)
    assert list(funcs) == ["toy"]
    blocks = sass_model.build_cfg(funcs["toy"])
    loops = sass_model.natural_loops(blocks)
    assert len(loops) == 2
    inner, outer = sorted(loops, key=lambda lp: len(lp.body))
    assert inner.body < outer.body


def test_steady_path_skips_partial_blocks_and_divergent_detours() -> None:
    loop = _toy().loop
    # header (2) + LDG..SHFL (7) + STG and its BRA (2) + LOP3 (1) + latch (2)
    assert loop.instructions == 14
    assert loop.by_opcode.get("STG") == 1  # the vector store only, not the byte stores
    assert loop.by_opcode.get("NOP") is None and loop.by_opcode.get("WARPSYNC") is None
    assert loop.by_pipe["alu"] == 4  # ISETP, PRMT, LOP3, ISETP
    assert loop.by_pipe["control"] == 4  # the four branches
    assert loop.by_pipe["fma"] == 1 and loop.slots["fma"] == 2  # IMAD.WIDE: two slots
    # LDS: one slot; LDS.128 at a uniform address: one broadcast wavefront; SHFL: one
    assert loop.by_pipe["shared"] == 3 and loop.slots["shared"] == 3
    assert loop.slots["global"] == 8  # two 128-bit accesses, four slots each
    assert sum(loop.by_pipe.values()) == loop.instructions


def test_tile_overhead_leaves_the_inner_loop_out() -> None:
    model = _toy()
    # IADD3, the inner loop (not counted), BAR, ISETP, BRA
    assert model.tile.instructions == 4
    per = model.per_block(amortized=True)
    assert per["issue"] == pytest.approx(14 + 4 / 2)


def test_bounds_follow_the_formula() -> None:
    model = _toy()
    b = model.bounds(amortized=False)
    m = sass_model.H100_SXM
    rows = {r["pipe"]: r for r in b["rows"]}
    expect_issue = m.sms * m.boost_ghz * 1e9 * 128 / 14 * 16 / 1e9
    assert rows["issue"]["gbps_boost"] == pytest.approx(expect_issue, abs=0.1)
    assert b["gbps_boost"] == min(r["gbps_boost"] for r in rows.values() if r["gbps_boost"])
    assert rows["control"]["gbps_boost"] is None  # issue-only pipes impose no bound of their own


def test_unknown_opcodes_are_counted_as_other() -> None:
    assert sass_model.pipe_of("FOOBAR.X") == "other"
    assert sass_model.pipe_of("ULDC.64") == "uniform"
    assert sass_model.pipe_of("IMAD.SHL.U32") == "fma"


def _require_tools() -> None:
    if sass_model.find_nvcc() is None:
        pytest.skip("nvcc is not installed")
    if sass_model.find_disassembler(sass_model.find_nvcc()) is None:
        pytest.skip("nvdisasm is not installed (pip install nvidia-cuda-nvdisasm)")


@pytest.fixture(scope="module")
def real_model() -> sass_model.KernelModel:
    _require_tools()
    return sass_model.run_model()


@pytest.mark.nvcc
def test_model_of_gcm_chunks_is_structurally_sane(real_model: sass_model.KernelModel) -> None:
    model = real_model
    loop = model.loop
    assert sum(loop.by_pipe.values()) == loop.instructions == sum(loop.by_opcode.values())
    assert loop.by_pipe["other"] == 0, loop.by_opcode
    # One block per iteration: the text block in (LDG.128), its power of H (LDG.128), one store.
    assert loop.by_opcode.get("LDG") == 2 and loop.by_opcode.get("STG") == 1
    # AES-256: 14 rounds x 16 table lookups, plus the round keys; GHASH: 9 32x32 products of
    # 16 wide multiplies each.
    assert loop.by_opcode["LDS"] >= 224
    assert loop.by_opcode["IMAD.WIDE"] >= 144
    assert model.k == 4
    assert model.ptxas.get("spill_stores") == 0 and model.ptxas.get("registers", 0) > 0
    steady, amort = model.bounds(amortized=False), model.bounds(amortized=True)
    assert 0 < amort["gbps_boost"] <= steady["gbps_boost"]
    assert amort["gbps_base"] < amort["gbps_boost"]
    data: dict[str, Any] = json.loads(json.dumps(model.to_json()))
    assert data["kernel"] == "gcm_chunks" and data["amortized"]["limiter"] in sass_model.PIPES


@pytest.mark.nvcc
def test_table_and_command_line(
    real_model: sass_model.KernelModel, capsys: pytest.CaptureFixture[str]
) -> None:
    table = sass_model.render(real_model)
    assert all(name in table for name in (*sass_model.PIPES, "issue", "rates:"))
    assert sass_model.main(["--json", "--min-gbps", "1e9"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)["kernel"] == "gcm_chunks"
    assert "below" in captured.err


@pytest.mark.nvcc
def test_a_prebuilt_cubin_gives_the_same_model(
    real_model: sass_model.KernelModel, tmp_path: Path
) -> None:
    nvcc = sass_model.find_nvcc()
    assert nvcc is not None
    cubin = tmp_path / "k.cubin"
    subprocess.run(
        [nvcc, "-arch=sm_90", "-cubin", "-o", str(cubin), str(sass_model.SOURCE)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    model = sass_model.run_model(cubin=cubin)
    assert model.loop == real_model.loop and model.tile == real_model.tile
    assert model.ptxas == {}


# --- the model-digest kernels ----------------------------------------------------------------


@pytest.fixture(scope="module")
def hash_models() -> dict[str, sass_model.KernelModel]:
    _require_tools()
    return {name: sass_model.run_model(kernel=name) for name in ("sha256_shards", "blake3_chunks")}


def _check_hash_loop(model: sass_model.KernelModel) -> None:
    loop = model.loop
    assert sum(loop.by_pipe.values()) == loop.instructions == sum(loop.by_opcode.values())
    assert loop.by_pipe["other"] == 0, loop.by_opcode
    # The aligned 64-byte message block: sixteen 32-bit loads, no byte loads, no stores.
    assert loop.by_opcode.get("LDG") == 16 and loop.slots["global"] == 16
    assert loop.by_opcode.get("STG") is None
    assert model.ptxas.get("spill_stores") == 0 and model.ptxas.get("spill_loads") == 0
    assert model.ptxas.get("registers", 0) > 0
    assert model.block_bytes == 64 and not model.per_tile
    steady, amort = model.bounds(amortized=False), model.bounds(amortized=True)
    assert steady == amort  # nothing outside the loop is modelled
    assert 0 < steady["gbps_base"] < steady["gbps_boost"]


@pytest.mark.nvcc
def test_model_of_sha256_shards_is_structurally_sane(
    hash_models: dict[str, sass_model.KernelModel],
) -> None:
    model = hash_models["sha256_shards"]
    _check_hash_loop(model)
    ops = model.loop.by_opcode
    # 64 rounds (Sigma0, Sigma1: three rotates each) and 48 schedule words (sigma0, sigma1:
    # two rotates each): at least 64 x 6 + 48 x 4 funnel shifts, and rounds of several ALU ops.
    assert ops.get("SHF", 0) >= 64 * 6 + 48 * 4
    assert model.loop.by_pipe["alu"] >= 64 * 12
    assert model.bounds(amortized=False)["limiter"] == "alu"


@pytest.mark.nvcc
def test_model_of_blake3_chunks_is_structurally_sane(
    hash_models: dict[str, sass_model.KernelModel],
) -> None:
    model = hash_models["blake3_chunks"]
    _check_hash_loop(model)
    ops = model.loop.by_opcode
    # 7 rounds x 8 G functions, each with four rotates (SHF or PRMT), four XORs and six adds.
    g = 7 * 8
    assert ops.get("SHF", 0) + ops.get("PRMT", 0) >= 4 * g
    assert ops.get("LOP3", 0) >= 4 * g
    assert model.loop.by_pipe["alu"] + model.loop.by_pipe["fma"] >= 12 * g
    # One compression per iteration, not the whole chunk (16 compressions) unrolled.
    assert model.loop.instructions < 2 * 14 * g
    assert model.bounds(amortized=False)["limiter"] == "alu"


@pytest.mark.nvcc
def test_hash_tables_and_all(capsys: pytest.CaptureFixture[str]) -> None:
    _require_tools()
    assert sass_model.main(["--kernel", "sha256_shards"]) == 0
    table = capsys.readouterr().out
    assert "per 64-byte block" in table and "x 64 B of message" in table
    assert sass_model.main(["--all", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [d["kernel"] for d in data] == list(sass_model.KERNELS)
    by_name = {d["kernel"]: d for d in data}
    for gcm in ("gcm_chunks", "gcm_msgs"):
        assert "bytes_per_iteration" not in by_name[gcm]  # the GCM kernels' JSON is as before
    for digest in ("sha256_shards", "blake3_chunks"):
        assert by_name[digest]["bytes_per_iteration"] == 64
    assert sass_model.main(["--all", "--min-gbps", "1e9"]) == 1
    assert capsys.readouterr().err.count("below") == len(sass_model.KERNELS)
