"""The domain: what a run is and how it may change, below every read model and above the log.

- `lifecycle/`: the state folded from a run's events, the judge of each transition, the deciders (pure).
- `chain_walk`: one record through the chain check and the fold, for the command side and the read side.
- `vouching`: whose signature a run's chain rests on (pure).
- `command_handler`: `RunLog`, the one way to append: decide against the run's own log, judge, append with
  its head expected, decide again after a lost race.
"""
