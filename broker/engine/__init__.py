"""The engine, along its seams (each module's docstring says what it owns):

- ``step``: ``Engine``, whose ``step()`` is the list of what happens in a step, in order;
- ``jobs``: what is done with a job in each state, and starting it once its GPUs are ready;
- ``machine``: job states and their transitions, the only writer of job state;
- ``clusters``: cluster lifecycle (launch, sync, relaunch, release, reap), the only writer of cluster state;
- ``planning``: the one builder of the selection policy's request;
- ``review``: the once-a-tick review of where a running job should be;
- ``packing``: gangs on shared clusters, placement and in-cluster preemption;
- ``checkpoints``: checkpoints, attempts and the work lost between them;
- ``notices``: termination notices, recorded once;
- ``metering``: the cost ledger;
- ``stages``: pipelines, a chained stage held back until the one before it succeeded;
- ``parts``: the options and collaborators every part is given.
"""

from broker.engine.parts import EngineOptions, engine_options
from broker.engine.step import Engine

__all__ = ["Engine", "EngineOptions", "engine_options"]
