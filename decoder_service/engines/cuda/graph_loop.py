"""The device-resident decode loop: one captured graph per head, replayed for every request.

    seed step (mask, head, step on the prefill's hidden state; publishes the loop predicate)
    WHILE predicate: forward pass (token and position read from the control block), mask, head, step

Nothing in the body touches the host: the token, position, trie node, spent pointers and output live in device
memory (the output in mapped host memory, which the host polls). The graph holds no grammar: the control block
names the trie (0: the constant bank, which the caller re-binds on the stream before each launch).
"""

from __future__ import annotations

from decoder_service.engines.cuda import driver
from decoder_service.engines.cuda.driver import call
from decoder_service.engines.cuda.forward import CudaModel
from decoder_service.engines.cuda.step import CTL, StepLaunches, StepState


class DecodeGraph:
    """The instantiated graph of the loop for one model, one step state, one head and one form of decode attention
    (``cluster_attention``: as ``CudaModel.step_launches`` takes it)."""

    def __init__(self, model: CudaModel, state: StepState, dense: bool, cluster_attention: bool = False) -> None:
        cu = driver.cu
        ctx = driver.init()
        stream = model.stream
        self.stream = stream
        self.graph = call("cuGraphCreate", 0)
        # Default value 1 on every launch; the seed step and every body step assign it.
        self.handle = call("cuGraphConditionalHandleCreate", self.graph, ctx, 1, cu.CU_GRAPH_COND_ASSIGN_DEFAULT)
        cond = int(self.handle)
        seed = StepLaunches(model, state, dense, cond=cond)
        step = StepLaunches(model, state, dense, cond=cond)
        forward, _ = model.step_launches(
            token_ptr=state.ctl.ptr + 4 * CTL["token"],
            pos_ptr=state.ctl.ptr + 4 * CTL["pos"],
            cluster_attention=cluster_attention,
        )
        self.body_launches = [*forward, *step.launches]
        mode = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        call("cuStreamBeginCaptureToGraph", stream.handle, self.graph, None, None, 0, mode)
        try:
            for launch in seed.launches:
                launch(stream)
            _, _, _, deps, _, ndeps = call("cuStreamGetCaptureInfo", stream.handle)
            params = cu.CUgraphNodeParams()
            params.type = cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
            params.conditional.handle = self.handle
            params.conditional.type = cu.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_WHILE
            params.conditional.size = 1
            params.conditional.ctx = ctx
            node = call("cuGraphAddNode", self.graph, deps, None, ndeps, params)
            body = params.conditional.phGraph_out[0]
            call(
                "cuStreamUpdateCaptureDependencies",
                stream.handle,
                [node],
                None,
                1,
                cu.CUstreamUpdateCaptureDependencies_flags.CU_STREAM_SET_CAPTURE_DEPENDENCIES,
            )
        finally:
            call("cuStreamEndCapture", stream.handle)
        call("cuStreamBeginCaptureToGraph", stream.handle, body, None, None, 0, mode)
        try:
            for launch in self.body_launches:
                launch(stream)
        finally:
            call("cuStreamEndCapture", stream.handle)
        self.exec = call("cuGraphInstantiate", self.graph, 0)
        self.nodes_per_step = len(self.body_launches)

    def launch(self) -> None:
        """Queue one whole answer on the stream (the control block must be reset first, on the same stream)."""
        call("cuGraphLaunch", self.exec, self.stream.handle)

    def destroy(self) -> None:
        call("cuGraphExecDestroy", self.exec)
        call("cuGraphDestroy", self.graph)
