"""When the restart-cost driver kills a job: step-gated or time-based, decided from the clock and the newest
settled checkpoint. Pure: the driver feeds it what it observed and delivers the SIGKILL itself."""

from ftrain.experiments.experiment_config import Injection


class KillSchedule:
    """The kills still to come for one phase.

    `newest` is the newest checkpoint both complete on disk and recorded in the log: a kill between the two
    would make the trainer set the sealed-but-unrecorded one aside and resume from an older one, which is
    correct but not the failure being measured. A kill also waits for a checkpoint newer than the previous
    kill's, so that every kill costs a restart and the supervisor never sees two attempts without progress
    (it gives up on those). Nor does it kill a job whose last step is checkpointed: nothing is left to lose.
    """

    def __init__(self, injection: Injection, train_iters: int, copy: str = "checkpoint") -> None:
        self.injection = injection
        self.train_iters = train_iters
        self.copy = copy
        """What `newest` is, for the trigger: a `checkpoint`, or (the memory phase) a `memory snapshot`."""
        self.fired = 0
        self.first_complete: float | None = None
        self.last_newest: int | None = None

    def due(self, now: float, newest: int | None) -> str | None:
        """Why to kill the job now (the trigger, for the kill record), or None."""
        injection = self.injection
        if injection.kind == "save" or self.fired >= injection.kills or newest is None:
            return None
        if newest >= self.train_iters:
            return None
        if self.first_complete is None:
            self.first_complete = now
        if self.last_newest is not None and newest <= self.last_newest:
            return None
        if injection.kind == "steps":
            gate = injection.steps[self.fired]
            return f"{self.copy} {newest} complete (gate {gate})" if newest >= gate else None
        assert injection.every_seconds is not None
        elapsed = now - self.first_complete
        if elapsed < (self.fired + 1) * injection.every_seconds:
            return None
        return f"{elapsed:.1f} s after the first complete checkpoint (every {injection.every_seconds:g} s)"

    def fired_at(self, newest: int) -> None:
        """The kill was delivered with `newest` the newest settled checkpoint."""
        self.fired += 1
        self.last_newest = newest
