"""Width pruning of decoder LLMs: query heads, key/value groups and MLP channels removed together under one budget,
with no retraining, as the tools LLM users compare do it (LLM-Pruner, FLAP, Wanda-sp, Minitron, Torch-Pruning), each
reimplemented from its paper and code, beside the paper's importance and the project's own method.

    statistics.py    one forward and backward pass of the unpruned model: everything every criterion reads
    criteria.py      each method's score of every head and MLP channel
    allocation.py    the costs (parameters, FLOPs, KV-cache bytes) and who goes: Kwon's search, FLAP's threshold,
                     or one width for every layer (a stock folder)
    compensation.py  FLAP's bias (any family's in memory; a stock folder holds it where the config can say so)
                     and the least-squares refit (a stock folder)
    methods.py       the methods by name: criterion, allocation, own compensation
    sweep.py         every method, compensation and level side by side, on the same windows
"""
