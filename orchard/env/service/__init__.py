"""The sandbox service, composed of parts with narrow interfaces (see sandbox_service.py): the
server builds one and the routes call its parts."""

from orchard.env.service.branching import FORK_LABEL, Branching
from orchard.env.service.exec_jobs import ExecJobs
from orchard.env.service.lifecycle import Lifecycle, model_env
from orchard.env.service.pools import Pools
from orchard.env.service.reconciler import ControlLoop, PartialPass, Reconciler
from orchard.env.service.records import LIVE, POOL_LABEL, RunningSandboxes, SandboxRecords
from orchard.env.service.sandbox_ops import SandboxOps
from orchard.env.service.sandbox_service import SandboxService, replica_id
from orchard.env.service.snapshots import Snapshots

__all__ = [
    "FORK_LABEL", "LIVE", "POOL_LABEL", "Branching", "ControlLoop", "ExecJobs", "Lifecycle",
    "PartialPass", "Pools", "Reconciler", "RunningSandboxes", "SandboxOps", "SandboxRecords",
    "SandboxService", "Snapshots", "model_env", "replica_id",
]
