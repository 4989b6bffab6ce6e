"""The host-driven decode loop: the same kernels as the graph, launched one by one, with the token and position
passed as host arguments (the reference the graph loop must match bit for bit, and the fallback driver)."""

from __future__ import annotations

from collections.abc import Iterator

from decoder_service.engines.cuda.forward import CudaModel
from decoder_service.engines.cuda.step import CTL, StepLaunches, StepState


class HostLoop:
    """Seed step, then per token: read the control block, launch forward (host form), mask, head, step.
    ``cluster_attention``: as ``CudaModel.step_launches`` takes it."""

    def __init__(self, model: CudaModel, state: StepState, dense: bool, cluster_attention: bool = False) -> None:
        self.model = model
        self.state = state
        self.step = StepLaunches(model, state, dense, cond=0)
        self.forward, self.pos_args = model.step_launches(token_ptr=0, pos_ptr=0, cluster_attention=cluster_attention)

    def run(self) -> Iterator[None]:
        """Decode one answer, pausing after each step (the caller publishes pointers meanwhile)."""
        stream = self.model.stream
        for launch in self.step.launches:
            launch(stream)
        while True:
            ctl = self.state.read_ctl()
            yield
            if ctl[CTL["done"]] or ctl[CTL["error"]]:
                return
            self.forward[0].set(2, int(ctl[CTL["token"]]))  # embed_gather's token_host
            for launch, index in self.pos_args:
                launch.set(index, int(ctl[CTL["pos"]]))
            for launch in (*self.forward, *self.step.launches):
                launch(stream)
