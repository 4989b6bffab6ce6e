"""The host-driven decode loop: the same kernels as the graph, launched one by one, with the token and position
passed as host arguments (the reference the graph loop must match bit for bit, and the fallback driver)."""

from __future__ import annotations

from collections.abc import Iterator

from decoder_service.engines.cuda.forward import AttentionForm, CudaModel
from decoder_service.engines.cuda.step import CTL, StepLaunches, StepState


class HostLoop:
    """Seed step, then per step: read the control block, launch the forward pass (the single token's in host form,
    or a forced chain's, which reads its tokens from the control block), head, step (which masks the next node).
    ``attention``: as ``CudaModel.step_launches`` takes it; ``chains``: whether the step may leave chains."""

    def __init__(
        self, model: CudaModel, state: StepState, dense: bool, attention: AttentionForm = "global", chains: bool = False
    ) -> None:
        self.model = model
        self.state = state
        self.step = StepLaunches(model, state, dense)
        norm = self.step.forward_norm
        self.forward, self.pos_args = model.step_launches(token_ptr=0, pos_ptr=0, attention=attention, final_norm=norm)
        self.chain = state.chain_launches(model, attention, final_norm=norm) if chains else []

    def run(self) -> Iterator[None]:
        """Decode one answer, pausing after each step (the caller publishes pointers meanwhile)."""
        stream = self.model.stream
        for launch in self.step.first:
            launch(stream)
        while True:
            ctl = self.state.read_ctl()
            yield
            if ctl[CTL["done"]] or ctl[CTL["error"]]:
                return
            if ctl[CTL["nchain"]] > 1:
                forward = self.chain
            else:
                forward = self.forward
                forward[0].set(2, int(ctl[CTL["token"]]))  # embed_gather's token_host
                for launch, index in self.pos_args:
                    launch.set(index, int(ctl[CTL["pos"]]))
            for launch in (*forward, *self.step.launches):
                launch(stream)
