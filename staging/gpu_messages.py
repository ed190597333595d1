"""AES-256-GCM over batches of independent messages on a GPU (the encrypted gradient exchange).

A :class:`DeviceKeyring` holds the key contexts of several keys on one device. One call seals
(or opens) a batch of messages in one ``gcm_msgs`` + ``gcm_msgs_finalize`` launch pair on the
keyring's stream: each message has its own key (an index into the keyring), its own 96-bit
nonce and associated data (computed by the caller from its schedule, never read from the
wire), and its own place in the batch's input and output buffers. Opening writes one status
word per message (0 authentic, 1 tag mismatch) and zeroes the output of a message whose tag
fails; the caller reads the words when it must decide, not after every launch.

Nothing here copies plaintext to the host: the caller's buffers are device arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpucc.core.errors import UsageError

from . import _gpu_runtime as _rt
from ._gpu_msg_kat import check_messages
from ._gpu_runtime import _K, _MAX_THREADS, _ctx_words, _Kernels, _modules_lock, check_aligned

__all__ = ["MAX_KEYS", "MAX_MESSAGES", "DeviceKeyring", "DeviceMessage", "import_cupy"]

#: Keys per keyring (key contexts are ~20 KiB each).
MAX_KEYS = 4096
#: Messages per batch (one gcm_msgs_finalize CTA each).
MAX_MESSAGES = 1 << 16
#: GCM's plaintext limit, 2^39 - 256 bits.
MAX_MESSAGE_BYTES = (1 << 36) - 32
#: Words of one message descriptor (kMsgWords in aesgcm_math.cuh).
MSG_WORDS = 16
#: CTA width of gcm_msgs: tiles of 4 x 256 blocks (16 KiB).
WIDTH = _MAX_THREADS
_CT = _K * WIDTH
_TAG = 16


@dataclass(frozen=True)
class DeviceMessage:
    """One message of a batch.

    Attributes:
        key: index of its key in the keyring.
        nonce: the 12-byte GCM nonce.
        aad: the associated data.
        src: byte offset of its input text in the batch's ``src`` (a multiple of 16).
        dst: byte offset of its output text in the batch's ``dst`` (a multiple of 16).
        tag: byte offset of its tag: in ``dst`` when sealing (written), in ``src`` when
            opening (read).
        length: text length in bytes.
    """

    key: int
    nonce: bytes
    aad: bytes
    src: int
    dst: int
    tag: int
    length: int


def import_cupy() -> Any:
    """CuPy, imported once (for callers of the message kernels that build device buffers).

    Raises:
        GpuStagingUnavailableError: CuPy is not installed or finds no usable device.
    """
    return _rt.import_cupy()


def _tiles(length: int) -> int:
    blocks = -(-length // 16)
    return -(-blocks // _CT)


def _check_ranges(
    messages: Sequence[DeviceMessage], src_size: int, dst_size: int, *, seal: bool
) -> None:
    """Every message inside its buffers, 16-byte aligned, outputs not overlapping."""
    writes: list[tuple[int, int]] = []
    for i, m in enumerate(messages):
        if len(m.nonce) != 12:
            raise UsageError(f"message {i}: a nonce is 12 bytes")
        if not 0 <= m.length <= MAX_MESSAGE_BYTES:
            raise UsageError(f"message {i}: length {m.length} is outside GCM's limit")
        if m.src % 16 or m.dst % 16 or m.src < 0 or m.dst < 0 or m.tag < 0:
            raise UsageError(f"message {i}: text offsets must be non-negative multiples of 16")
        if len(m.aad) >= 1 << 31:
            raise UsageError(f"message {i}: associated data too long")
        tag_in, tag_size = (dst_size, "dst") if seal else (src_size, "src")
        if m.src + m.length > src_size or m.dst + m.length > dst_size:
            raise UsageError(f"message {i}: its text runs past the end of its buffer")
        if m.tag + _TAG > tag_in:
            raise UsageError(f"message {i}: its tag runs past the end of {tag_size}")
        writes.append((m.dst, m.dst + m.length))
        if seal:
            writes.append((m.tag, m.tag + _TAG))
    writes.sort()
    for (_, end), (start, _) in zip(writes, writes[1:], strict=False):
        if start < end:
            raise UsageError("the outputs of a batch overlap")


def _descriptors(messages: Sequence[DeviceMessage]) -> tuple[np.ndarray, bytes, int]:
    """The descriptor words, the AAD bytes and the work items of a batch.

    The AADs are stored one after another, each padded with zeros to a multiple of 16 bytes
    (the device buffer itself is 16-byte aligned), so every AAD starts 16-byte aligned.
    """
    desc = np.zeros((len(messages), MSG_WORDS), dtype=np.uint32)
    aad = bytearray()
    item = 0
    for i, m in enumerate(messages):
        row = desc[i]
        for word, value in ((0, m.src), (2, m.dst), (4, m.tag), (6, m.length), (8, item)):
            row[word] = value & 0xFFFFFFFF
            row[word + 1] = value >> 32
        row[10] = m.key
        row[11:14] = np.frombuffer(m.nonce, dtype="<u4")
        row[14] = len(aad)
        row[15] = len(m.aad)
        # Each AAD starts on a 16-byte boundary: gcm_msgs_finalize reads whole blocks of it
        # with 16-byte vector loads, which fault at any other address.
        aad += m.aad + bytes(-len(m.aad) % 16)
        item += _tiles(m.length)
    if len(aad) >= 1 << 32:
        raise UsageError("the associated data of a batch is too long")
    return desc.reshape(-1), bytes(aad) or b"\x00", item


class DeviceKeyring:
    """AES-256 key contexts of several keys on one device, and message batches under them.

    Everything runs on one stream, ``stream`` (the current stream by default): the contexts
    are built there, batches are launched there and :meth:`close` zeroes the contexts there.
    The device copies of the raw keys are zeroed right after their contexts are built.
    Before the first keyring on a device, the message kernels must reproduce the known
    answers of :mod:`staging._gpu_msg_kat`.

    Raises:
        GpuStagingUnavailableError, GpuKernelError: see :func:`staging.gpu.require_gpu`.
        UsageError: no keys, too many, or a key that is not 32 bytes.
    """

    def __init__(
        self,
        keys: Sequence[bytes],
        *,
        device_id: int = 0,
        stream: Any = None,
        _unchecked: tuple[_Kernels, int] | None = None,
    ) -> None:
        if not 1 <= len(keys) <= MAX_KEYS:
            raise UsageError(f"a keyring holds 1 to {MAX_KEYS} keys")
        if any(len(k) != 32 for k in keys):
            raise UsageError("AES-256 keys are 32 bytes")
        self.cupy = cupy = _rt.import_cupy()
        self.device_id = device_id
        self.size = len(keys)
        if _unchecked is None:
            self.kernels, self.grid_cap = _message_kernels(device_id)
        else:  # the known answers themselves
            self.kernels, self.grid_cap = _unchecked
        self.ctxs: Any = None
        self.partials: Any = None
        self._keep: tuple[Any, ...] = ()
        words = _ctx_words(_CT)
        with cupy.cuda.Device(device_id):
            self.stream: Any = cupy.cuda.get_current_stream() if stream is None else stream
        raw: Any = None
        try:
            with cupy.cuda.Device(device_id), self.stream:
                self.ctxs = cupy.zeros(words * len(keys), dtype=cupy.uint32)
                raw = cupy.asarray(np.frombuffer(b"".join(keys), dtype=np.uint8))
                for i in range(len(keys)):
                    self.kernels.setup(
                        (1,),
                        (256,),
                        (
                            raw[32 * i : 32 * (i + 1)],
                            self.ctxs[words * i : words * (i + 1)],
                            np.uint32(_CT),
                            np.uint64(0),
                            np.uint64(0),
                        ),
                    )
                raw.fill(0)
        except BaseException as exc:
            self._fail([raw])
            if isinstance(exc, _rt.device_faults(cupy)):
                raise _rt.launch_fault(device_id, exc) from None
            raise

    def __repr__(self) -> str:
        return f"DeviceKeyring(keys={self.size}, device={self.device_id})"

    def seal(self, messages: Sequence[DeviceMessage], src: Any, dst: Any) -> None:
        """Seal ``messages``: texts from ``src`` to ``dst``, tags into ``dst``."""
        self._launch(messages, src, dst, None, seal=True)

    def open(
        self, messages: Sequence[DeviceMessage], src: Any, dst: Any, status: Any = None
    ) -> Any:
        """Open ``messages``: texts and tags from ``src``, texts to ``dst``; one uint32
        verdict per message into ``status`` (0 authentic, 1 rejected and its text zeroed).

        Returns ``status`` (a new device array when None was given). Its words are written
        on :attr:`stream`: read them after that stream (``status.get()`` inside it).
        """
        return self._launch(messages, src, dst, status, seal=False)

    def use_stream(self, stream: Any) -> None:
        """Launch on ``stream`` from now on, ordered after everything queued so far."""
        if int(stream.ptr) == int(self.stream.ptr):
            return
        try:
            with self.cupy.cuda.Device(self.device_id):
                done = self.cupy.cuda.Event(disable_timing=True)
                done.record(self.stream)
                stream.wait_event(done)
        except self._faults() as exc:
            self._fail([])
            raise _rt.launch_fault(self.device_id, exc) from None
        self.stream = stream

    def _launch(
        self, messages: Sequence[DeviceMessage], src: Any, dst: Any, status: Any, *, seal: bool
    ) -> Any:
        if self.ctxs is None:
            raise UsageError("the keyring is closed")
        if not 1 <= len(messages) <= MAX_MESSAGES:
            raise UsageError(f"a batch holds 1 to {MAX_MESSAGES} messages")
        if any(not 0 <= m.key < self.size for m in messages):
            raise UsageError("a message names a key the keyring does not hold")
        for name, arr in (("src", src), ("dst", dst)):
            if arr.dtype != np.uint8 or arr.ndim != 1:
                raise UsageError(f"{name} must be a 1-D uint8 device array")
            check_aligned(name, arr)
        _check_ranges(messages, int(src.size), int(dst.size), seal=seal)
        s0, d0 = int(src.data.ptr), int(dst.data.ptr)
        if s0 < d0 + int(dst.size) and d0 < s0 + int(src.size):
            raise UsageError("src and dst of a batch must not overlap")
        desc_np, aad_bytes, items = _descriptors(messages)
        if status is not None and (status.dtype != np.uint32 or status.size != len(messages)):
            raise UsageError("status must hold one uint32 word per message")
        try:
            return self._queue(messages, items, desc_np, aad_bytes, src, dst, status, seal=seal)
        except self._faults() as exc:
            self._fail([dst])
            raise _rt.launch_fault(self.device_id, exc) from None

    def _queue(
        self,
        messages: Sequence[DeviceMessage],
        items: int,
        desc_np: np.ndarray,
        aad_bytes: bytes,
        src: Any,
        dst: Any,
        status: Any,
        *,
        seal: bool,
    ) -> Any:
        """The launch pair of a checked batch on :attr:`stream`."""
        cupy = self.cupy
        with cupy.cuda.Device(self.device_id), self.stream:
            if status is None:
                status = cupy.empty(len(messages), dtype=cupy.uint32)
            need = max(1, items) * 4
            if self.partials is None or self.partials.size < need:
                if self.partials is not None:
                    self.partials.fill(0)
                self.partials = cupy.empty(need, dtype=cupy.uint32)
            desc = cupy.asarray(desc_np)
            aad = cupy.asarray(np.frombuffer(aad_bytes, dtype=np.uint8))
            common = (desc, aad)
            if items:
                self.kernels.msgs(
                    (min(items, self.grid_cap),),
                    (WIDTH,),
                    (
                        src,
                        dst,
                        self.ctxs,
                        self.partials,
                        *common,
                        np.uint32(len(messages)),
                        np.uint64(items),
                        np.uint32(1 if seal else 0),
                    ),
                )
            self.kernels.msgs_finalize(
                (len(messages),),
                (256,),
                (
                    src,
                    dst,
                    self.ctxs,
                    self.partials,
                    *common,
                    status,
                    np.uint32(len(messages)),
                    np.uint32(1 if seal else 0),
                    np.uint32(_CT),
                ),
            )
            # Descriptors stay referenced until the next launch on this stream is queued.
            self._keep = (desc, aad, status)
        return status

    def verdicts(self, status: Any, dst: Any) -> np.ndarray:
        """The verdict words ``status`` of a batch opened into ``dst`` (0 authentic, 1 rejected
        and its text zeroed), read after :attr:`stream` got there.

        Raises:
            GpuKernelError: a kernel faulted (``stage="launch"``): the words cannot be trusted,
                so all of ``dst`` is zeroed, and the keyring is closed (its contexts zeroed).
        """
        try:
            with self.cupy.cuda.Device(self.device_id), self.stream:
                words: np.ndarray = self.cupy.asnumpy(status)
        except self._faults() as exc:
            self._fail([dst])
            raise _rt.launch_fault(self.device_id, exc) from None
        return words

    def close(self) -> None:
        """Zero the key contexts and the GHASH scratch, after the launches that use them.

        Raises:
            GpuKernelError: a launch of this keyring faulted (``stage="launch"``); the
                contexts and the scratch were zeroed as far as the device still takes work.
        """
        if self.ctxs is None:
            return
        bufs = [self.ctxs, self.partials]
        self.ctxs = self.partials = None
        self._keep = ()
        fault = _rt.zero_buffers(self.cupy, self.device_id, self.stream, bufs)
        if fault is not None:
            raise _rt.launch_fault(self.device_id, fault) from None

    def _faults(self) -> tuple[type[BaseException], ...]:
        return _rt.device_faults(self.cupy)

    def _fail(self, outputs: Sequence[Any]) -> None:
        """After an error: zero ``outputs`` and the keyring's own buffers; it is closed."""
        bufs = [*outputs, self.ctxs, self.partials]
        self.ctxs = self.partials = None
        self._keep = ()
        _rt.zero_buffers(self.cupy, self.device_id, self.stream, bufs)

    def __enter__(self) -> DeviceKeyring:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _message_kernels(device_id: int) -> tuple[_Kernels, int]:
    """The device's kernels and gcm_msgs' persistent grid, known answers checked once.

    Raises:
        GpuStagingUnavailableError, GpuKernelError: see :func:`staging.gpu.require_gpu`.
    """
    kernels = _rt._kernels(device_id)
    with _modules_lock:
        if not kernels.msgs_grid:
            cupy = _rt.import_cupy()
            with cupy.cuda.Device(device_id):
                grid = _rt._persistent_grid(cupy, kernels, device_id, WIDTH, name="gcm_msgs")

                def open_keyring(keys: Sequence[bytes]) -> DeviceKeyring:
                    return DeviceKeyring(keys, device_id=device_id, _unchecked=(kernels, grid))

                check_messages(cupy, device_id, grid, open_keyring, DeviceMessage)
            kernels.msgs_grid = grid
        return kernels, kernels.msgs_grid
