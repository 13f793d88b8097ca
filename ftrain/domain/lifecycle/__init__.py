"""The run's lifecycle, pure: the state folded from its events, the judge of every transition, and the
deciders that turn a writer's request into the event the judge checks. No I/O; unit tests need no server.

- `state`: RunState and CheckpointRef, what the log says about a run.
- `judge`: `check` (is this event legal now?) and `apply` (the fold); IllegalTransition.
- `deciders`: relaunch, resume, skip, complete, a supervisor lost, and outbox intent → event.
- `resume_plan`: which checkpoints a resume tries, for the CLI and the trainer alike.
- `intents`: what trainers and supervisors ask to record through the outbox.
"""

from ftrain.domain.lifecycle.deciders import (
    check_owner,
    check_relaunch,
    completed_event,
    corrupt_skipped_event,
    decide_intent,
    relaunch,
    restart_event,
    resume_from,
    resumed_event,
    skip,
    supervisor_lost,
)
from ftrain.domain.lifecycle.intents import (
    CheckpointIntent,
    CompleteIntent,
    FailIntent,
    Intent,
    ReplicaIntent,
    ResumeIntent,
    SkipIntent,
    SnapshotIntent,
)
from ftrain.domain.lifecycle.judge import (
    IllegalTransition,
    apply,
    check,
    check_may_resume,
    check_open,
)
from ftrain.domain.lifecycle.resume_plan import (
    Candidate,
    OnDisk,
    ResumePlan,
    no_valid_refusal,
    plan_resume,
    rank_count,
    restarted_in_place,
    resumed_line,
    skipped_line,
)
from ftrain.domain.lifecycle.run_state import CheckpointRef, NodeCopy, RunState, RunStatus, SnapshotRef

__all__ = [
    "Candidate",
    "CheckpointIntent",
    "CheckpointRef",
    "CompleteIntent",
    "FailIntent",
    "IllegalTransition",
    "Intent",
    "NodeCopy",
    "OnDisk",
    "ReplicaIntent",
    "ResumeIntent",
    "ResumePlan",
    "RunState",
    "RunStatus",
    "SkipIntent",
    "SnapshotIntent",
    "SnapshotRef",
    "apply",
    "check",
    "check_may_resume",
    "check_open",
    "check_owner",
    "check_relaunch",
    "completed_event",
    "corrupt_skipped_event",
    "decide_intent",
    "no_valid_refusal",
    "plan_resume",
    "rank_count",
    "relaunch",
    "restart_event",
    "restarted_in_place",
    "resume_from",
    "resumed_event",
    "resumed_line",
    "skip",
    "skipped_line",
    "supervisor_lost",
]
