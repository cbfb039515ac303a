"""The engine, along its seams (each module's docstring says what it owns):

- ``step``: ``Engine``, whose ``step()`` is the list of what happens in a step, in order;
- ``parts``: the options and collaborators every part is given;
- ``jobs``: what is done with a job in each state, and starting it once its GPUs are ready;
- ``machine``: job states and their transitions, the only writer of job state;
- ``clusters``: cluster lifecycle (launch, sync, relaunch, release, reap), the only writer of cluster state;
- ``queue``: one batched view of the queue, so that queued jobs that certainly wait cost nothing per step;
- ``running``: one batched view of the running jobs, so that a running job with nothing to do costs no transaction;
- ``fair_share``: the fair-share step: which teams' gangs may start, and borrowed GPUs taken back at a checkpoint;
- ``autoscale``: how long a cluster nobody holds is kept for the next job;
- ``planning``: the one builder of the selection policy's request;
- ``feasibility``: whether a market could ever hold a job, checked at submission;
- ``review``: the once-a-tick review of where a running job should be;
- ``packing``: gangs on shared clusters, placement and in-cluster preemption;
- ``shares``: GPUs shared by fractions, and placing a fraction;
- ``eager``: readying the next queued job before a running job's predicted finish;
- ``reservations``: which queued jobs hold a running job's GPUs;
- ``setup_ahead``: a reserved job's ``setup`` run before its start;
- ``forecast``: when each running job will finish;
- ``checkpoints``: checkpoints, attempts and the work lost between them;
- ``checkpoint_reports``: the checkpoints node agents report, the one record the engine decides from;
- ``cadence``: when to ask a running spot job for a periodic checkpoint;
- ``notices``: a recorded termination notice turned into a checkpoint and a replacement;
- ``metering``: the cost ledger;
- ``gpu_attribution``: measured idle GPU time inside running jobs, moved to its cause in the ledger;
- ``stages``: pipelines, a chained stage held back until the one before it succeeded.
"""

from broker.engine.parts import EngineOptions, engine_options
from broker.engine.step import Engine

__all__ = ["Engine", "EngineOptions", "engine_options"]
