"""The device-resident decode loop: one captured graph per head, replayed for every request.

    seed step (mask, head, step on the prefill's hidden state; publishes the loop predicate)
    WHILE predicate:
        IF the step left a forced chain: the chain's forward pass (its tokens read from the control block)
        ELSE: the single token's forward pass (token and position read from the control block)
        head (the sparse head normalises the pass's last row itself: the passes end without the final norm
        then), step (which ends with the next node's mask)

Nothing in the body touches the host: the token, position, trie node, spent pointers and output live in device
memory (the output in mapped host memory, which the host polls). The graph holds no grammar: the control block
names the trie (0: the constant bank, which the caller re-binds on the stream before each launch). A model whose
step takes no chains gets the single-token body alone.
"""

from __future__ import annotations

from typing import Any

from decoder_service.engines.cuda import driver
from decoder_service.engines.cuda.driver import call
from decoder_service.engines.cuda.forward import AttentionForm, CudaModel
from decoder_service.engines.cuda.module import Launch
from decoder_service.engines.cuda.step import CTL, StepLaunches, StepState


class DecodeGraph:
    """The instantiated graph of the loop for one model, one step state, one head and one form of decode attention
    (``attention``: as ``CudaModel.step_launches`` takes it); ``chains``: the body's IF node and the chain's
    forward pass (the model must support them)."""

    def __init__(
        self, model: CudaModel, state: StepState, dense: bool, attention: AttentionForm = "global", chains: bool = False
    ) -> None:
        cu = driver.cu
        self._ctx = driver.init()
        stream = model.stream
        self.stream = stream
        self.graph = call("cuGraphCreate", 0)
        # Default 1 (loop) and 0 (chain) on every launch; the seed step and every body step assign both.
        self.handle = call("cuGraphConditionalHandleCreate", self.graph, self._ctx, 1, cu.CU_GRAPH_COND_ASSIGN_DEFAULT)
        chain_handle = (
            call("cuGraphConditionalHandleCreate", self.graph, self._ctx, 0, cu.CU_GRAPH_COND_ASSIGN_DEFAULT)
            if chains
            else 0
        )
        conds = (int(self.handle), int(chain_handle))
        seed = StepLaunches(model, state, dense, conds=conds)
        step = StepLaunches(model, state, dense, conds=conds)
        single, _ = model.step_launches(
            token_ptr=state.ctl.ptr + 4 * CTL["token"],
            pos_ptr=state.ctl.ptr + 4 * CTL["pos"],
            attention=attention,
            final_norm=step.forward_norm,
        )
        chain = state.chain_launches(model, attention, final_norm=step.forward_norm) if chains else []
        cond = cu.CUgraphConditionalNodeType
        (body,), _ = self._conditional(self.graph, seed.first, self.handle, cond.CU_GRAPH_COND_TYPE_WHILE)
        if chains:  # an IF node of size 2: the chain's pass when its handle is set, else the single token's
            (then, other), branch = self._conditional(body, [], chain_handle, cond.CU_GRAPH_COND_TYPE_IF, size=2)
            self._capture(then, chain)
            self._capture(other, single)
            self._capture(body, step.launches, after=branch)
        else:
            self._capture(body, [*single, *step.launches])
        self.exec = call("cuGraphInstantiate", self.graph, 0)

    def _conditional(self, graph: Any, before: list[Launch], handle: Any, kind: Any, size: int = 1) -> tuple[list, Any]:
        """Capture ``before`` into ``graph``, then a conditional node after it; return the node's body graphs
        (``size`` of them: an IF node of size 2 has a then and an else body) and the node."""
        cu = driver.cu
        mode = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        call("cuStreamBeginCaptureToGraph", self.stream.handle, graph, None, None, 0, mode)
        try:
            for launch in before:
                launch(self.stream)
            _, _, _, deps, _, ndeps = call("cuStreamGetCaptureInfo", self.stream.handle)
            params = cu.CUgraphNodeParams()
            params.type = cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
            params.conditional.handle = handle
            params.conditional.type = kind
            params.conditional.size = size
            params.conditional.ctx = self._ctx
            node = call("cuGraphAddNode", graph, deps, None, ndeps, params)
            bodies = [params.conditional.phGraph_out[i] for i in range(size)]
            call(
                "cuStreamUpdateCaptureDependencies",
                self.stream.handle,
                [node],
                None,
                1,
                cu.CUstreamUpdateCaptureDependencies_flags.CU_STREAM_SET_CAPTURE_DEPENDENCIES,
            )
        finally:
            call("cuStreamEndCapture", self.stream.handle)
        return bodies, node

    def _capture(self, graph: Any, launches: list[Launch], after: Any = None) -> None:
        """Capture ``launches`` into ``graph``, after the node ``after`` when given."""
        cu = driver.cu
        deps, ndeps = ([after], 1) if after is not None else (None, 0)
        mode = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        call("cuStreamBeginCaptureToGraph", self.stream.handle, graph, deps, None, ndeps, mode)
        try:
            for launch in launches:
                launch(self.stream)
        finally:
            call("cuStreamEndCapture", self.stream.handle)

    def launch(self) -> None:
        """Queue one whole answer on the stream (the control block must be reset first, on the same stream)."""
        call("cuGraphLaunch", self.exec, self.stream.handle)

    def destroy(self) -> None:
        call("cuGraphExecDestroy", self.exec)
        call("cuGraphDestroy", self.graph)
