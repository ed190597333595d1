"""Kernel geometry shared by the GPU runtime and its known answers (no CuPy, no imports).

The constants mirror staging/kernels/aesgcm_math.cuh; tests/unit/staging/test_kernel_harness.py
checks them against the header (harness command "layout").
"""

from __future__ import annotations

#: Blocks per thread per tile (GCMK_K).
_K = 4
#: Largest CTA of gcm_chunks (GCMK_MAX_THREADS).
_MAX_THREADS = 256
#: Threads of gcm_finalize (kCombineThreads); also the highest power of G in the key context.
_COMBINE_THREADS = 256
#: Word offset of H^1 in the key context (kCtxHPow).
_CTX_HPOW = 72


def _ctx_words(ct: int) -> int:
    """32-bit words of a key context for tiles of ``ct`` blocks (ctx_words in the header)."""
    return _CTX_HPOW + 4 * ct + 4 * (_COMBINE_THREADS + 1)


def _threads_for(chunk_size: int) -> int:
    """CTA width of gcm_chunks: the widest (<= 256) whose tile fits in a full chunk."""
    blocks = chunk_size // 16
    width = _MAX_THREADS
    while width > 32 and _K * width > blocks:
        width //= 2
    return width


def _tiles(length: int, ct: int) -> int:
    blocks = -(-length // 16)
    return -(-blocks // ct)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] if text else exc.__class__.__name__
