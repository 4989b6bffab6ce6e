"""A compiled trie on the device: its image (``CompiledTrie.device_image()``) in a per-grammar staging buffer, and
the binding of that image to the module's 64 KiB ``__constant__`` bank when it fits (global memory otherwise).

A CUDA graph does not snapshot ``__constant__`` (measured on an H200: a kernel reads the bank's contents at the
time it runs), so the bank is re-bound with a stream-ordered device-to-device copy on the launch stream before
every decode; a grammar switch therefore takes effect at the next launch and never tears a running one.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from decoder_service.engines.cuda.driver import Stream, call
from decoder_service.engines.cuda.memory import DeviceBuffer
from decoder_service.engines.cuda.module import Module
from tooltrie.grammar.trie import CONSTANT_BANK_BYTES, CompiledTrie

CONSTANT_SYMBOL = "tt_trie_const"
Placement = Literal["auto", "constant", "global"]
PLACEMENTS = ("auto", "constant", "global")


class DeviceTrie:
    """One grammar's trie image on the device; ``constant`` says whether decoding reads it from the bank."""

    def __init__(self, trie: CompiledTrie, stream: Stream, placement: Placement = "auto") -> None:
        if placement not in PLACEMENTS:
            raise ValueError(f"unknown trie placement {placement!r}; accepted: {', '.join(PLACEMENTS)}")
        image = trie.device_image()
        fits = len(image) <= CONSTANT_BANK_BYTES
        if placement == "constant" and not fits:
            raise ValueError(
                f"the trie's device image is {len(image)} bytes, over the {CONSTANT_BANK_BYTES}-byte constant bank; "
                "use placement 'auto' or 'global'"
            )
        self.trie = trie
        self.nbytes = len(image)
        self.constant = fits if placement == "auto" else placement == "constant"
        self.buffer = DeviceBuffer.from_array(np.frombuffer(image, dtype=np.uint8), stream)

    @property
    def global_ptr(self) -> int:
        """What the control block carries: the image's address, or 0 when kernels read the constant bank."""
        return 0 if self.constant else self.buffer.ptr

    def bind(self, module: Module, stream: Stream) -> None:
        """Make the bank hold this image for the work issued next on ``stream`` (no-op for a global trie)."""
        if not self.constant:
            return
        ptr, size = module.get_global(CONSTANT_SYMBOL)
        if self.nbytes > size:
            raise ValueError(f"the trie image ({self.nbytes} bytes) exceeds the constant bank ({size} bytes)")
        call("cuMemcpyDtoDAsync", ptr, self.buffer.ptr, self.nbytes, stream.handle)

    def free(self) -> None:
        self.buffer.free()
