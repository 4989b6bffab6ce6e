"""The numpy fp32 reference engine: the oracle for every other engine and the engine on machines without a GPU."""
