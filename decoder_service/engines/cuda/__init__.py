"""The CUDA engine: driver-API runtime (cuda.bindings only) over tooltrie's one cubin.

Importing this package never touches the GPU; ``cuda_available()`` says whether it can run here and why not.
"""

from decoder_service.engines.cuda.driver import CudaError, cuda_available

__all__ = ["CudaError", "cuda_available"]
